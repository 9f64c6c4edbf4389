"""Rollout: executions of an agent through the TITO proxy and the harness, one `Executed` each.

Owns `Executed`, `Rollout` and `FailureStreak` (the gateway's `ExternalRollout` keeps one
too). For each execution it mints the proxy key, runs the agent under the harness with an
`ExecutionControl` fed from the proxy's running totals (turns, tokens, context refusals stop it
for partial scoring), then closes the execution in the proxy and returns the outcome with the
exact model-call records. At most `max_concurrent` agents run at once. One execution's failure is
its `failed` outcome (the harness's doing), never an exception; only a streak of them over
several tasks is (`FailureStreak`: a run whose agents cannot start stops at once, not after every
step was skipped). Knows nothing about trees, losses or training.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import msgspec

from gyre.agents.control import ExecutionControl
from gyre.agents.harness import Harness, HarnessStatistics
from gyre.config import HarnessConfig, RunConfig
from gyre.engines.protocol import InferenceEngine
from gyre.errors import ExecutionError
from gyre.tasks.outcome import Outcome
from gyre.tasks.task import Task
from gyre.tito.proxy import TitoProxy
from gyre.tito.records import ExecutionSummary, ModelCall

__all__ = ["Executed", "FailureStreak", "Rollout", "open_rollout", "run_jobs", "with_interpreter"]

_POLL_S = 0.05
"""How often a running execution's limits are checked against the proxy's totals."""


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
                calls = self.proxy.calls(execution_id)
            finally:
                with anyio.CancelScope(shield=True):
                    summary = await self.proxy.close(execution_id)
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
                results[i] = await run(task, execution_id)
                if on_done is not None:
                    on_done(i, results[i])

            tg.start_soon(one)
    return [r for r in results if r is not None]


def with_interpreter(harness: HarnessConfig) -> HarnessConfig:
    """A leading `python` in `agent_command` means this node's interpreter (its venv)."""
    command = harness.agent_command
    if command and command[0] == "python":
        return msgspec.structs.replace(harness, agent_command=(sys.executable, *command[1:]))
    return harness


@asynccontextmanager
async def open_rollout(
    config: RunConfig,
    *,
    tokenizer: Any,
    engine_for: Callable[[str], InferenceEngine],
    max_concurrent: int,
) -> AsyncIterator[Rollout]:
    """The run's TITO proxy served on a task of its own (call log at `<run_dir>/<proxy.log_name>`),
    the harness pointed at it, and a `Rollout` over both; the proxy stops on exit. With
    `[gateway] enabled`, an `ExternalRollout` (`gyre.runtime.external`) instead of the harness:
    its execution API is served too and its address written to `<run_dir>/gateway.json`."""
    run_dir = Path(config.run_dir).resolve()  # agents run in their workspaces: no relative paths
    proxy = TitoProxy(
        tokenizer=tokenizer,
        engine_for=engine_for,
        config=config.proxy,
        log_path=str(run_dir / config.proxy.log_name),
    )
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.serve)
        if config.gateway.enabled:
            from gyre.runtime.external_api import open_gateway

            async with open_gateway(
                config,
                proxy,
                base_url=f"http://{config.proxy.host}:{port}/v1",
                max_concurrent=max_concurrent,
            ) as rollout:
                yield rollout
            tg.cancel_scope.cancel()
            return
        harness = Harness.from_config(
            with_interpreter(config.tasks.harness),
            base_url=f"http://{config.proxy.host}:{port}/v1",
            model=config.proxy.model_name,
            run_dir=run_dir,
        )
        for suite in config.tasks.suites:  # no agent reads another suite's hidden tests either
            harness.hide_suite(Path(suite).resolve())
        yield Rollout(
            proxy,
            harness,
            max_concurrent=max_concurrent,
            max_consecutive_failures=config.loop.max_consecutive_failures,
        )
        tg.cancel_scope.cancel()
