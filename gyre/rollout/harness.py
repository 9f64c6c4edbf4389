"""The harness source: executions of a local agent through the TITO proxy, one `Executed` each.

Owns `Rollout`. For each execution it mints the proxy key, runs the agent under the harness with
an `ExecutionControl` fed from the proxy's running totals (turns, tokens, context refusals stop it
for partial scoring), then ends the execution in the proxy and returns the outcome with its
final model-call records (those the call log holds for it). At most `max_concurrent` agents run
at once. One execution's failure is its `failed` outcome (the harness's doing), never an
exception; only a streak of them over several tasks is (`FailureStreak`). Also
`with_interpreter` (a leading `python` in the agent command is the node's interpreter). Knows
nothing about trees, losses, cells or training.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import anyio
import msgspec

from gyre.agents.control import ExecutionControl
from gyre.agents.harness import Harness, HarnessStatistics
from gyre.config import HarnessConfig
from gyre.rollout.source import Executed, FailureStreak, run_jobs
from gyre.tasks.task import Task
from gyre.tito.proxy import TitoProxy

__all__ = ["Rollout", "with_interpreter"]

_POLL_S = 0.05
"""How often a running execution's limits are checked against the proxy's totals."""


class Rollout:
    """Runs executions: `await rollout.run(task, execution_id)`, or many with `run_many`.

    `max_consecutive_failures`: the `run` whose end trips the run's `FailureStreak` with that limit
    raises its `ExecutionError`; 0: never."""

    def __init__(
        self,
        proxy: TitoProxy,
        harness: Harness,
        *,
        max_concurrent: int,
        max_consecutive_failures: int = 0,
    ) -> None:
        self.proxy = proxy
        self.harness = harness
        self.limiter = anyio.CapacityLimiter(max_concurrent)
        self.streak = FailureStreak(max_consecutive_failures)

    async def run(self, task: Task, execution_id: str) -> Executed:
        """Run one execution to its end (finished, stopped at a limit, or failed). Raises
        `ExecutionError` when its failure trips the streak (`FailureStreak`)."""
        async with self.limiter:
            key = self.proxy.mint_key(execution_id)

            def refresh(control: ExecutionControl) -> None:
                s = self.proxy.summary(execution_id)
                control.observe_totals(
                    model_calls=s.num_calls,
                    completion_tokens=s.completion_tokens,
                    context_refusals=s.context_refusals,
                )

            limits = task.spec.agent
            control = ExecutionControl(
                max_turns=limits.max_turns, token_budget=limits.token_budget, refresh=refresh
            )
            try:
                async with anyio.create_task_group() as tg:

                    async def watch() -> None:
                        while True:
                            control.refresh()
                            await anyio.sleep(_POLL_S)

                    tg.start_soon(watch)
                    outcome = await self.harness.run(
                        task, execution_id, control=control, api_key=key
                    )
                    tg.cancel_scope.cancel()
            finally:
                with anyio.CancelScope(shield=True):
                    # the execution's final calls, as the log holds them (B42)
                    summary, calls = await self.proxy.end(execution_id)
        self.streak.observe(outcome)
        return Executed(outcome=outcome, calls=calls, summary=summary)

    async def run_many(
        self,
        jobs: Sequence[tuple[Task, str]],
        on_done: Callable[[int, Executed], None] | None = None,
    ) -> list[Executed]:
        """Run `(task, execution_id)` jobs concurrently (up to the limiter); results in job order.
        `on_done(job_index, executed)` runs as each one finishes (e.g. to persist it at once)."""
        return await run_jobs(self.run, jobs, on_done)

    def statistics(self) -> HarnessStatistics:
        """The counters of the executions' source (here the harness's)."""
        return self.harness.statistics()


def with_interpreter(harness: HarnessConfig) -> HarnessConfig:
    """A leading `python` in `agent_command` means this node's interpreter (its venv)."""
    command = harness.agent_command
    if command and command[0] == "python":
        return msgspec.structs.replace(harness, agent_command=(sys.executable, *command[1:]))
    return harness
