"""What every rollout source gives the driver: one `Executed` per execution.

Owns `Executed` (an execution's outcome, its exact model-call records and the proxy's totals),
`RolloutSource` (the seam: `run`, `run_many`, `statistics`), `FailureStreak` (a run whose agents
cannot start stops at once, not after every step was skipped) and `run_jobs`. The two sources,
the harness (`gyre.rollout.harness`) and the gateway (`gyre.rollout.gateway`), both keep a
`FailureStreak`. Knows nothing about trees, losses or training.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import anyio
import msgspec

from gyre.errors import ExecutionError
from gyre.tasks.outcome import Outcome
from gyre.tasks.task import Task
from gyre.tito.proxy import TitoProxy
from gyre.tito.records import ExecutionSummary, ModelCall

__all__ = ["Executed", "FailureStreak", "RolloutSource", "run_jobs"]


class Executed(msgspec.Struct, frozen=True, kw_only=True):
    """One finished execution: its outcome, every model call, and the proxy's totals."""

    outcome: Outcome
    calls: list[ModelCall]
    summary: ExecutionSummary


class FailureStreak:
    """Failed executions in a row, in the order they ended, and the tasks they cover.

    `observe` raises `ExecutionError` (once) when `limit` failed executions in a row cover two tasks
    or more: the failure is the run's (an agent command that cannot start, a verifier that cannot
    run), not one broken task's, whose whole group fails together. `limit` is a count of
    executions; 0: never raises. Raises `ValueError` for `limit` < 0."""

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"limit={limit} must be >= 0")
        self.limit = limit
        self.count = 0
        """Executions failed since the last one that did not fail."""
        self.tasks: set[str] = set()
        """The tasks of those executions."""
        self.tripped = False

    def observe(self, outcome: Outcome) -> None:
        """Count `outcome` (a finished or stopped one ends the streak)."""
        if not outcome.failed:
            self.count = 0
            self.tasks.clear()
            return
        self.count += 1
        self.tasks.add(outcome.task_id)
        if self.limit and not self.tripped and self.count >= self.limit and len(self.tasks) > 1:
            self.tripped = True
            raise ExecutionError(
                f"{self.count} executions of {len(self.tasks)} tasks failed in a row "
                f"(loop.max_consecutive_failures={self.limit}), the last {outcome.execution_id} "
                f"of {outcome.task_id}: {outcome.failure_reason}"
            )


class RolloutSource(Protocol):
    """Where a run's executions come from: the harness's agents or loops run elsewhere. Either
    way every model call goes through the run's TITO proxy (`proxy`)."""

    proxy: TitoProxy

    async def run(self, task: Task, execution_id: str) -> Executed:
        """Run one execution to its end (finished, stopped at a limit, or failed)."""
        ...

    async def run_many(
        self,
        jobs: Sequence[tuple[Task, str]],
        on_done: Callable[[int, Executed], None] | None = None,
    ) -> list[Executed]:
        """Run `(task, execution_id)` jobs concurrently; results in job order."""
        ...

    def statistics(self) -> Any:
        """The source's counters (a msgspec Struct)."""
        ...


async def run_jobs(
    run: Callable[[Task, str], Awaitable[Executed]],
    jobs: Sequence[tuple[Task, str]],
    on_done: Callable[[int, Executed], None] | None = None,
) -> list[Executed]:
    """`await run(task, execution_id)` for every job concurrently; results in job order, and
    `on_done(job_index, executed)` as each one finishes (`Rollout.run_many`)."""
    results: list[Executed | None] = [None] * len(jobs)
    async with anyio.create_task_group() as tg:
        for i, (task, execution_id) in enumerate(jobs):

            async def one(i: int = i, task: Task = task, execution_id: str = execution_id) -> None:
                executed = await run(task, execution_id)
                results[i] = executed
                if on_done is not None:
                    on_done(i, executed)

            tg.start_soon(one)
    return [r for r in results if r is not None]
