"""gyre.routing (see docs/design.md): requests in front of the rollout cells.

`router` routes each generation to a rollout cell (intake, replay, aborts); `membership` holds
the cells, session affinity and placement; `continuation` keeps a choice's attempts across cells;
`redirect` moves in-flight requests off a cell that leaves rollout (recompute or migrate KV).
"""

from gyre.routing.router import Router, RouterStatistics

__all__ = ["Router", "RouterStatistics"]
