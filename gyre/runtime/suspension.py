"""Suspension of executions in the node runtime (partial rollouts), the simulator's rule.

Owns `Suspension`: the executions a role switch left without a rollout cell with room, first
suspended first, and its counts. When a cell leaves rollout, `move_off` moves each of its
executions to the least loaded rollout cell that stays and has room, and suspends the others
(`gyre.runtime.mechanics.move_off`, the rule `gyre.sim.engine` applies); `resume` puts them back,
first in, first out, as soon as a rollout slot is free (`mechanics.resume_suspended`), before the
policy dispatches anything new. `rehome` empties a lost cell (dead, or dropped after a failed
weight load): its executions go to the survivors in rollout, or wait suspended for a cell
switching to rollout. A suspended execution is held in the `Router` (`Router.hold`): its
model calls in flight are aborted with their sampled tokens kept and its agent's requests wait,
unanswered, until its next pin, where they continue from their tokens so far like a redirected
call. Its agent runs on and its deadline still counts: one that ends while suspended is stopped
and scored like any other (`ended`).

Knows nothing about policies, engines or what an execution does; the driver
(`gyre.runtime.elastic.ElasticRuntime`) hands it its cells and its pin.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from gyre.errors import RunStalled
from gyre.routing.router import Router
from gyre.runtime.cell_handle import DrivenCell
from gyre.runtime.mechanics import least_loaded, move_off, resume_suspended

__all__ = ["Suspension"]


class Suspension:
    """The suspended executions of one run (`queue`, oldest first) and how often suspension
    happened.

    Args:
        router: the run's router; a suspended execution is held there until it is pinned again.
    """

    def __init__(self, router: Router) -> None:
        self.router = router
        self.queue: deque[str] = deque()
        """Execution IDs suspended now, in the order they were suspended."""
        self.suspensions = 0
        """Times an execution was suspended."""
        self.resumptions = 0
        """Times a suspended execution was pinned to a rollout cell again."""

    def move_off(
        self,
        cell: DrivenCell,
        cells: Sequence[DrivenCell],
        capacity: int,
        avoid: frozenset[int],
        pin: Callable[[str, DrivenCell], None],
    ) -> None:
        """Empty `cell` (leaving rollout; its `executions` are IDs): each execution, in ID order, is
        pinned (`pin(execution_id, target)`) to the least loaded cell of `cells` outside `avoid`
        with fewer than `capacity` executions, or suspended when none has room."""
        move_off(
            sorted(cell.executions),
            cells,
            capacity=capacity,
            avoid=avoid,
            move=pin,
            suspend=self._suspend,
        )
        cell.executions.clear()

    def rehome(
        self, cell: DrivenCell, cells: Sequence[DrivenCell], pin: Callable[[str, DrivenCell], None]
    ) -> None:
        """Empty `cell`, which is lost (dead or dropped; not in `cells`): each execution, in ID
        order, is pinned to the least loaded rollout cell of `cells`, beyond its capacity if need
        be (the survivors take them); with none in rollout but one switching to it, each is
        suspended and resumes there. Raises `RunStalled` when it has executions and no cell rolls
        out or is switching to it (none could ever run them)."""
        if cell.executions and least_loaded(cells, capacity=None) is None:
            if not any(c.target == "rollout" for c in cells):
                raise RunStalled(f"no rollout cell to move cell {cell.name}'s executions to")
            for execution_id in sorted(cell.executions):
                self._suspend(execution_id)
        else:
            for execution_id in sorted(cell.executions):
                target = least_loaded(cells, capacity=None)
                assert target is not None  # one rolls out (checked above); pins only add to it
                pin(execution_id, target)
        cell.executions.clear()

    def _suspend(self, execution_id: str) -> None:
        self.router.hold(execution_id)
        self.queue.append(execution_id)
        self.suspensions += 1

    def resume(
        self, cells: Sequence[DrivenCell], *, capacity: int, pin: Callable[[str, DrivenCell], None]
    ) -> int:
        """Pin suspended executions, oldest first, to the least loaded cells of `cells` with room
        (`pin` must add the execution to the cell's executions and pin it in the router, which
        releases its hold); returns how many resumed."""
        resumed = resume_suspended(self.queue, cells, capacity=capacity, resume=pin)
        self.resumptions += resumed
        return resumed

    def ended(self, execution_id: str) -> bool:
        """Forget `execution_id` if it ended while suspended (its agent stopped at its deadline,
        or failed); returns whether it was suspended. The router forgets its hold with
        `end_execution`."""
        if execution_id not in self.queue:
            return False
        self.queue.remove(execution_id)
        return True
