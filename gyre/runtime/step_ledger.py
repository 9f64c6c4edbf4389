"""The elastic runtime's per-step bookkeeping: the run clock, what each step did and its metrics.

Owns `StepRecord` (what one step did) and `StepLedger`: the run's clock (seconds since the run
started), the marks of the current step (its start, when its batch was in, when it was trained),
the trainers' statistics of its groups, the router's recovered-failure counters at its start, and
the `StepRecord`s of the steps done. Closing a step appends its record and writes its
`StepMetrics` line with the statistics records the metric sinks stream (`sink_statistics`). Knows
nothing about scheduling or how cells move: the driver (`gyre.runtime.elastic`) says what happened.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from gyre.engines.protocol import mismatch_split
from gyre.runtime.batch_formation import Group
from gyre.runtime.cell_handle import DrivenCell
from gyre.runtime.loop import pass_rate
from gyre.runtime.metrics import StepMetrics
from gyre.runtime.rollout import Rollout
from gyre.runtime.router import Router, RouterStatistics
from gyre.runtime.weight_version import WeightVersion

__all__ = ["StepLedger", "StepRecord", "sink_statistics"]


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
        result: Any,
        t_step: float,
        metrics: Any,
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
        if metrics is not None:
            recovered = _recovered(self.router.statistics())
            metrics.write(
                _step_metrics(
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
                        **{k: v - self.step_recovered[k] for k, v in recovered.items()},
                    },
                ),
                statistics() if metrics.sinks else None,
            )
            self.step_recovered = recovered
        self.step_t0 = self.clock()
        self.step_switches = switches
        self.train_stats = []
        return record


def sink_statistics(
    *,
    router: Router,
    rollout: Rollout,
    weights: WeightVersion,
    live: Sequence[DrivenCell],
    dispatched: int,
    finished: int,
    switches: int,
) -> dict[str, Any]:
    """The `statistics()` records the metric sinks stream at each step (`sinks`), and the
    driver's own counters under `runtime` (water level, cells by role, switches)."""
    runtime = {
        "dispatched": dispatched,
        "finished": finished,
        "water_level": dispatched - finished,
        "live_cells": len(live),
        "rollout_cells": sum(c.role == "rollout" for c in live),
        "train_cells": sum(c.role == "train" for c in live),
        "switches": switches,
    }
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
    }


def _mismatch(stats) -> dict[str, float]:
    """`StepMetrics`' same-version and stale mismatch from the step's `AccumulateStatistics`."""
    split = mismatch_split(stats)
    return {
        "same_version_mismatch_mean": split["same_version_abs_diff_mean"],
        "stale_mismatch_mean": split["stale_abs_diff_mean"],
    }


def _step_metrics(record, executed, batches, stats, counted, result, times) -> StepMetrics:
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
        **_mismatch(stats),
        applied=bool(result.applied),
        step_s=record.step_s,
        **times,
    )
