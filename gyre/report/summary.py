"""The numbers of a run's one-page summary, computed from its metrics records.

Owns `RunSummary` (steps, time split, executions, pass rates before / after / best, mismatch,
branches), `summarize` and `split_records` (steps and evaluations, a step recorded twice counted
once with its last record). Reads only `gyre.runtime.metrics` records; knows nothing about plots
or the page.
"""

from __future__ import annotations

import math

import msgspec

from gyre.runtime.metrics import EvalMetrics, StepMetrics

__all__ = ["RunSummary", "summarize", "split_records"]


class RunSummary(msgspec.Struct, frozen=True, kw_only=True):
    """The numbers of a run's one-page summary. Rates are fractions in [0, 1]; times in seconds."""

    steps: int
    """Distinct RL steps recorded."""
    first_step: int | None
    last_step: int | None
    wall_s: float
    """Sum of step wall times (`step_s`) and evaluation times (`eval_s`)."""
    rollout_s: float
    train_s: float
    sync_s: float
    eval_s: float
    """Sum of evaluation times."""
    executions: int
    """Training executions over all steps (evaluations not counted)."""
    finished: int
    partial: int
    """Executions stopped at a deadline and partially scored, over all steps."""
    failed: int
    """Executions failed for infrastructure reasons, over all steps."""
    skipped_steps: int
    """Steps whose optimizer update was not applied."""
    policy_tokens: int
    """Tokens that carried loss, over all steps."""
    branches: int | None
    """Trajectories (tree leaves) of the trained executions, over all steps; None when a step's
    record predates the count (`StepMetrics.branches` = -1)."""
    mean_dedup_ratio: float
    """Mean over steps of the per-step dedup ratio; NaN with no steps."""
    mean_logprob_abs_diff: float
    """Mean over steps of the behaviour-vs-trainer mismatch; NaN with no steps."""
    max_logprob_abs_diff: float
    """Largest per-step mean mismatch; NaN with no steps."""
    max_same_version_mismatch: float = math.nan
    """Largest per-step mismatch over tokens the trainer's own weight version sampled (numerics
    alone); NaN when no step recorded one."""
    max_stale_mismatch: float = math.nan
    """Largest per-step mismatch over older tokens (numerics plus off-policy drift); NaN when no
    step recorded one."""
    eval_split: str | None
    """Split used for before/after: `heldout` when there is one, else `train`, else None."""
    pass_before: float | None
    """Pass rate of the earliest evaluation (step 0 = before RL) of `eval_split`."""
    pass_before_step: int | None
    pass_after: float | None
    """Pass rate of the latest evaluation of `eval_split`; None unless there are two or more."""
    pass_after_step: int | None
    best_eval_pass: float | None
    """Highest evaluation pass rate of `eval_split` and the step it was measured at (earliest on
    ties)."""
    best_eval_step: int | None
    best_step: int | None
    """Step with the highest batch pass rate (earliest on ties)."""
    best_step_pass: float | None


def split_records(records: list) -> tuple[list[StepMetrics], list[EvalMetrics]]:
    """Steps and evaluations of `records`, in step order; a step (or a step's split) recorded
    twice keeps its last record."""
    by_step: dict[int, StepMetrics] = {}
    evals: dict[tuple[int, str], EvalMetrics] = {}
    for r in records:
        if isinstance(r, StepMetrics):
            by_step[r.step] = r
        else:
            evals[(r.step, r.split)] = r
    return [by_step[k] for k in sorted(by_step)], [evals[k] for k in sorted(evals)]


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else math.nan


def _max(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return max(xs) if xs else math.nan


def summarize(records: list[StepMetrics | EvalMetrics]) -> RunSummary:
    """The summary numbers of a run's records (as `read_metrics` returns them).

    Duplicate step numbers keep the last record; duplicate (step, split) evaluations likewise.
    """
    steps, evals = split_records(records)
    splits = {e.split for e in evals}
    split = "heldout" if "heldout" in splits else ("train" if "train" in splits else None)
    chosen = [e for e in evals if e.split == split]
    best_eval = max(chosen, key=lambda e: (e.pass_rate, -e.step)) if chosen else None
    best = max(steps, key=lambda s: (s.pass_rate, -s.step)) if steps else None
    return RunSummary(
        steps=len(steps),
        first_step=steps[0].step if steps else None,
        last_step=steps[-1].step if steps else None,
        wall_s=sum(s.step_s for s in steps) + sum(e.eval_s for e in evals),
        rollout_s=sum(s.rollout_s for s in steps),
        train_s=sum(s.train_s for s in steps),
        sync_s=sum(s.sync_s for s in steps),
        eval_s=sum(e.eval_s for e in evals),
        executions=sum(s.executions for s in steps),
        finished=sum(s.finished for s in steps),
        partial=sum(s.partial for s in steps),
        failed=sum(s.failed for s in steps),
        skipped_steps=sum(not s.applied for s in steps),
        policy_tokens=sum(s.policy_tokens for s in steps),
        branches=None if any(s.branches < 0 for s in steps) else sum(s.branches for s in steps),
        mean_dedup_ratio=_mean([s.dedup_ratio for s in steps]),
        mean_logprob_abs_diff=_mean([s.logprob_abs_diff_mean for s in steps]),
        max_logprob_abs_diff=max((s.logprob_abs_diff_mean for s in steps), default=math.nan),
        max_same_version_mismatch=_max([s.same_version_mismatch_mean for s in steps]),
        max_stale_mismatch=_max([s.stale_mismatch_mean for s in steps]),
        eval_split=split,
        pass_before=chosen[0].pass_rate if chosen else None,
        pass_before_step=chosen[0].step if chosen else None,
        pass_after=chosen[-1].pass_rate if len(chosen) > 1 else None,
        pass_after_step=chosen[-1].step if len(chosen) > 1 else None,
        best_eval_pass=best_eval.pass_rate if best_eval else None,
        best_eval_step=best_eval.step if best_eval else None,
        best_step=best.step if best else None,
        best_step_pass=best.pass_rate if best else None,
    )
