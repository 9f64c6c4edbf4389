"""gyre.rollout (see docs/design.md): where a run's executions come from.

Two sources give the driver one `Executed` per execution (`source`): the harness runs local agents
through the TITO proxy (`harness`); the gateway publishes executions to agent loops run elsewhere
(`gateway`, its HTTP API `gateway_api`). `sources.open_rollout` starts the proxy and the one a run
configures; `tasks` picks which tasks a run trains on and holds out.
"""

from __future__ import annotations

import typing

from gyre._lazy import lazy_exports as _lazy_exports

if typing.TYPE_CHECKING:
    from gyre.rollout.source import Executed, FailureStreak, RolloutSource
    from gyre.rollout.sources import open_rollout

__all__ = ["Executed", "FailureStreak", "RolloutSource", "open_rollout"]

__getattr__, __dir__ = _lazy_exports(
    __name__,
    {
        **dict.fromkeys(["Executed", "FailureStreak", "RolloutSource"], "gyre.rollout.source"),
        **dict.fromkeys(["open_rollout"], "gyre.rollout.sources"),
    },
)
