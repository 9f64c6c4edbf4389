"""The elastic runtime's per-step bookkeeping: the run clock, what each step did and its metrics.

Owns `StepRecord` (what one step did), `RuntimeStatistics` (the frozen record
`ElasticRuntime.statistics()` returns: roles, water level, switches, redirections, migrations,
suspensions, queue depths) and `StepLedger`: the run's clock (seconds since the run started), the
marks of the current step (its start, when its batch was in, when it was trained), the trainers'
statistics of its groups, the router's recovered-failure counters at its start, and the
`StepRecord`s of the steps done. Closing a step appends its record and writes its `StepMetrics`
line with the statistics records the metric sinks stream (`sink_statistics`). Knows nothing about
scheduling or how cells move: the driver (`gyre.runtime.elastic`) says what happened.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from gyre.cell.wire import StepResult
from gyre.engines.protocol import mismatch_split
from gyre.rollout.source import Executed, RolloutSource
from gyre.routing.router import Router, RouterStatistics
from gyre.runtime.batch import TrainingBatch
from gyre.runtime.batch_formation import Group
from gyre.runtime.data_stream import pass_rate
from gyre.runtime.driver_state import DriverState
from gyre.runtime.metrics import MetricsWriter, StepMetrics
from gyre.runtime.weight_version import WeightVersion

__all__ = [
    "StepLedger",
    "StepRecord",
    "RuntimeStatistics",
    "runtime_statistics",
    "sink_statistics",
]


class StepRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What one step of the elastic runtime did (besides its `StepMetrics` line)."""

    step: int
    version: int
    end_s: float
    """Seconds since the run started when the optimizer step was published."""
    step_s: float
    """Seconds since the previous step ended (the run start for step 1)."""
    groups: int
    executions: int
    switches: int
    """Role switches completed during the step."""


class RuntimeStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What the elastic runtime is doing now (`ElasticRuntime.statistics()`); counters since the
    run started unless named otherwise. Metrics, the report, the live page and tests read this
    record, never the driver's internals."""

    steps_done: int
    weight_version: int
    """The published weight version."""
    roles: tuple[str, ...]
    """Each cell's role, in cell order (`rollout`, `train`, `switching`, or `dead`: dropped, its
    process gone or its engine failed a weight load)."""
    cells_rollout: int
    cells_train: int
    cells_switching: int
    cells_dead: int
    dispatched: int
    """Training executions started."""
    finished: int
    """Training executions ended (finished, stopped or failed)."""
    water_level: int
    """Unfinished training executions: ``dispatched - finished``."""
    rollout_capacity: int
    """``capacity_per_cell`` x live rollout cells."""
    switches: int
    """Role switches completed (the initial roles are not switches)."""
    switch_s_total: float
    """Seconds spent in completed switches, all cells together."""
    switch_s_max: float
    redirections: int
    """Requests moved off a cell that left rollout or went down (`Router` statistics)."""
    migrations: int
    """Redirected requests whose KV cache moved with them instead of being recomputed (their
    target reported loading it)."""
    tokens_migrated: int
    migrations_missed: int = 0
    """Redirected requests handed an export that their target did not load: recomputed instead
    (e.g. its KV folder is not the source's)."""
    tokens_recomputed: int
    """Tokens prefilled again on the target of a redirect."""
    suspensions: int = 0
    """Times an execution was suspended: its cell left rollout and no rollout cell that stays had
    room (`gyre.runtime.suspension`)."""
    resumptions: int = 0
    """Times a suspended execution was pinned to a rollout cell again."""
    suspended: int = 0
    """Executions suspended now (in the water level, on no cell)."""
    train_queue: int
    """Groups of the current step's batch ready for training and not handed to a cell."""
    train_running: int
    """Groups being trained now."""
    backlog: int
    """Finished groups waiting for a later step's batch."""
    groups_held: int
    """Groups the driver holds (dispatching, in the current batch, or in the backlog); trained
    groups are released when their step ends, so this is bounded by the work in flight."""
    evaluating: bool
    """A held-out evaluation is running (no step publishes meanwhile)."""
    eval_executions: int
    """Evaluation executions in flight."""


class StepLedger:
    """The run clock and the current step's marks; `close` turns them into a `StepRecord`.

    Args:
        router: the run's router (its recovered-failure counters are recorded per step).
        clock: seconds, monotonic.
    """

    def __init__(self, router: Router, clock: Callable[[], float]) -> None:
        self.router = router
        self.clock = clock
        self.records: list[StepRecord] = []
        self.last_metrics: StepMetrics | None = None
        """The `StepMetrics` of the last step closed (what the progress display shows)."""
        self.train_stats: list[Any] = []
        """The trainers' statistics of the current step's groups."""
        self.t0 = 0.0
        self.step_t0 = 0.0
        self.batch_in_s = math.nan
        self.trained_s = math.nan
        self.step_switches = 0
        self.step_recovered = _recovered(router.statistics())  # counters at the step start

    def start(self) -> None:
        """Start the run clock (and the first step)."""
        self.t0 = self.step_t0 = self.clock()

    def now(self) -> float:
        """Seconds since the run started."""
        return self.clock() - self.t0

    def mark_batch_in(self) -> None:
        """The current step's batch is complete."""
        self.batch_in_s = self.now()

    def mark_trained(self) -> None:
        """The current step's batch is trained."""
        self.trained_s = self.now()

    def close(
        self,
        *,
        step: int,
        version: int,
        groups: Sequence[Group],
        switches: int,
        result: StepResult,
        t_step: float,
        metrics: MetricsWriter | None,
        statistics: Callable[[], dict[str, Any]],
    ) -> StepRecord:
        """Record step `step` (published as `version`; `switches` completed so far in the run;
        `result` the core's step result, begun at `t_step`), write its metrics line to `metrics`
        (if any; `statistics()` for its sinks) and start the next step."""
        now = self.now()
        executed = [m for g in groups for m in g.members if m is not None]
        batches = [g.batch for g in groups if g.batch is not None]
        stats = self.train_stats
        counted = sum(s.counted for s in stats)
        step_s = now - (self.step_t0 - self.t0)
        record = StepRecord(
            step=step,
            version=version,
            end_s=now,
            step_s=step_s,
            groups=len(groups),
            executions=len(executed),
            switches=switches - self.step_switches,
        )
        self.records.append(record)
        recovered = _recovered(self.router.statistics())
        self.last_metrics = _step_metrics(
            record,
            executed,
            batches,
            stats,
            counted,
            result,
            {
                "rollout_s": self.batch_in_s - (self.step_t0 - self.t0),
                "train_s": t_step - self.batch_in_s,
                "sync_s": now - t_step,
            },
            {k: v - self.step_recovered[k] for k, v in recovered.items()},
        )
        self.step_recovered = recovered
        if metrics is not None:
            metrics.write(self.last_metrics, statistics() if metrics.sinks else None)
        self.step_t0 = self.clock()
        self.step_switches = switches
        self.train_stats = []
        return record


def runtime_statistics(state: DriverState, *, router: Router, capacity: int) -> RuntimeStatistics:
    """The `RuntimeStatistics` of the run in `state` (`ElasticRuntime.statistics()`), routed by
    `router`, with `capacity` executions per rollout cell."""
    routed = router.statistics()
    roles = tuple(c.role if c.alive else "dead" for c in state.cells)
    batches = state.batches
    groups = {id(g) for g in (*batches.dispatching.values(), *batches.step_groups)}
    groups.update(id(g) for g in batches.backlog)
    suspension = state.suspension
    return RuntimeStatistics(
        steps_done=state.steps_done,
        weight_version=state.weights.version,
        roles=roles,
        cells_rollout=roles.count("rollout"),
        cells_train=roles.count("train"),
        cells_switching=roles.count("switching"),
        cells_dead=roles.count("dead"),
        dispatched=state.dispatched,
        finished=state.finished,
        water_level=state.water_level,
        rollout_capacity=capacity * roles.count("rollout"),
        switches=state.switches_done,
        switch_s_total=sum(state.switch_s),
        switch_s_max=max(state.switch_s, default=0.0),
        redirections=routed.requests_redirected,
        migrations=routed.requests_migrated,
        tokens_migrated=routed.tokens_migrated,
        migrations_missed=routed.migrations_missed,
        tokens_recomputed=routed.tokens_recomputed,
        suspensions=suspension.suspensions,
        resumptions=suspension.resumptions,
        suspended=len(suspension.queue),
        train_queue=len(batches.queue),
        train_running=state.running,
        backlog=len(batches.backlog),
        groups_held=len(groups),
        evaluating=state.evaluating,
        eval_executions=len(state.evaluation.where) if state.evaluation is not None else 0,
    )


def sink_statistics(
    *, router: Router, rollout: RolloutSource, weights: WeightVersion, runtime: RuntimeStatistics
) -> dict[str, Any]:
    """The `statistics()` records the metric sinks stream at each step (`sinks`): the router's,
    the proxy's, the harness's, the published weights' and the runtime's own."""
    return {
        "router": router.statistics(),
        "proxy": rollout.proxy.statistics(),
        "harness": rollout.statistics(),
        "weights": weights.statistics(),
        "runtime": runtime,
    }


def _recovered(router: RouterStatistics) -> dict[str, int]:
    """The router's counters of recovered failures that `StepMetrics` records per step."""
    return {
        "requests_redirected": router.requests_redirected,
        "requests_retried": router.requests_retried,
        "requests_abandoned": router.requests_abandoned,
        "aborts_failed": router.aborts_failed,
        "migrations_missed": router.migrations_missed,
        "suspensions": router.holds,
    }


def _step_metrics(
    record: StepRecord,
    executed: Sequence[Executed],
    batches: Sequence[TrainingBatch],
    stats: Sequence[Any],
    counted: int,
    result: StepResult,
    times: dict[str, float],
    recovered: dict[str, int],
) -> StepMetrics:
    """The `StepMetrics` of a step: `times` its phases' seconds, `recovered` the router's
    recovered-failure counts during it (`_recovered`), `stats` its `AccumulateStatistics`."""
    split = mismatch_split(stats)  # same-version and stale mismatch
    rate, reward = pass_rate(executed)
    linear = sum(b.linear_tokens for b in batches)
    packed = sum(b.packed_tokens for b in batches)
    return StepMetrics(
        step=record.step,
        version=record.version,
        executions=len(executed),
        pass_rate=rate,
        mean_reward=reward,
        finished=sum(ex.outcome.termination == "finished" for ex in executed),
        partial=sum(ex.outcome.stopped for ex in executed),
        failed=sum(ex.outcome.failed for ex in executed),
        truncated=sum(ex.summary.truncated for ex in executed),
        model_calls=sum(len(ex.calls) for ex in executed),
        branches=sum(t.branches for b in batches for t in b.trees.values()),
        heals=sum(bool(c.heals) for ex in executed for c in ex.calls),
        policy_tokens=sum(b.policy_tokens for b in batches),
        packed_tokens=packed,
        dedup_ratio=linear / packed if packed else math.nan,
        logprob_abs_diff_mean=sum(s.logprob_abs_diff_sum for s in stats) / counted
        if counted
        else math.nan,
        mean_ratio=sum(s.ratio_sum for s in stats) / counted if counted else math.nan,
        same_version_mismatch_mean=split["same_version_abs_diff_mean"],
        stale_mismatch_mean=split["stale_abs_diff_mean"],
        applied=bool(result.applied),
        grad_norm=math.nan if result.grad_norm is None else float(result.grad_norm),
        step_s=record.step_s,
        rollout_s=times["rollout_s"],
        train_s=times["train_s"],
        sync_s=times["sync_s"],
        requests_redirected=recovered["requests_redirected"],
        requests_retried=recovered["requests_retried"],
        requests_abandoned=recovered["requests_abandoned"],
        aborts_failed=recovered["aborts_failed"],
        migrations_missed=recovered["migrations_missed"],
        suspensions=recovered["suspensions"],
    )
