"""Trajectory-tree statistics of a run's executions, for the run report.

Owns `ExecutionTree` (one execution's `TreeStatistics`, dedup ratio and flagged divergences),
`TreeTotals` (the same summed over executions, with per-execution spreads), `execution_trees`
(every execution of the run's call log, its calls merged into its tree by
`gyre.trajectory.build_tree`) and `tree_totals`. Reads only the call log; knows nothing about
metrics, plots or the page.
"""

from __future__ import annotations

import os
import statistics
from collections import Counter
from pathlib import Path

import msgspec

from gyre.tito.log import read_log
from gyre.tito.records import ModelCall
from gyre.trajectory.tree import TreeStatistics, build_tree

__all__ = ["ExecutionTree", "TreeTotals", "execution_trees", "tree_totals", "CALL_LOG"]

CALL_LOG = "calls.log"
"""The call log's default name under the run folder (`[proxy] log_name`)."""


class ExecutionTree(TreeStatistics, frozen=True, kw_only=True):
    """One execution's trajectory tree: its `TreeStatistics`, its ID and its divergences."""

    execution_id: str
    divergences: dict[str, int]
    """Calls whose prompt rewrote history, by the reason the proxy flagged (`compaction`, ...)."""

    @property
    def dedup_ratio(self) -> float:
        """tokens_in_calls / unique_tokens (>= 1): how much the tree saves over per-call rows."""
        return self.tokens_in_calls / self.unique_tokens if self.unique_tokens else float("nan")


class TreeTotals(msgspec.Struct, frozen=True, kw_only=True):
    """Trees summed over a run's executions; spreads are over executions."""

    executions: int
    calls: int
    tokens_in_calls: int
    unique_tokens: int
    policy_tokens: int
    branches: int
    branch_points: int
    divergences: dict[str, int]
    dedup_ratio: float
    """Summed tokens_in_calls / summed unique_tokens; NaN with no execution."""
    dedup_ratio_median: float
    """Median over executions of their own dedup ratio; NaN with none."""
    dedup_ratio_max: float
    branches_median: float
    branches_max: int
    depth_max: int


def _tree(execution_id: str, calls: list[ModelCall]) -> ExecutionTree:
    tree = msgspec.structs.asdict(build_tree(calls).statistics())
    reasons = Counter(c.divergence.reason for c in calls if c.divergence is not None)
    return ExecutionTree(
        execution_id=execution_id, divergences=dict(sorted(reasons.items())), **tree
    )


def execution_trees(
    run_dir: str | os.PathLike[str], log_name: str = CALL_LOG
) -> list[ExecutionTree]:
    """One `ExecutionTree` per execution with a call in `<run_dir>/<log_name>`, in the order of
    their first call. Raises `FileNotFoundError` when there is no call log and `LogCorruptError`
    for a corrupt frame before its end (a torn last frame is skipped)."""
    by_execution: dict[str, list[ModelCall]] = {}
    for call in read_log(Path(run_dir) / log_name).calls:
        by_execution.setdefault(call.execution_id, []).append(call)
    return [_tree(eid, calls) for eid, calls in by_execution.items()]


def tree_totals(trees: list[ExecutionTree]) -> TreeTotals:
    """The sums and spreads of `trees` (all zero / NaN for none)."""
    nan = float("nan")
    tokens = sum(t.tokens_in_calls for t in trees)
    unique = sum(t.unique_tokens for t in trees)
    reasons: Counter[str] = Counter()
    for t in trees:
        reasons.update(t.divergences)
    ratios = [t.dedup_ratio for t in trees if t.unique_tokens]
    return TreeTotals(
        executions=len(trees),
        calls=sum(t.calls for t in trees),
        tokens_in_calls=tokens,
        unique_tokens=unique,
        policy_tokens=sum(t.policy_tokens for t in trees),
        branches=sum(t.branches for t in trees),
        branch_points=sum(t.branch_points for t in trees),
        divergences=dict(sorted(reasons.items())),
        dedup_ratio=tokens / unique if unique else nan,
        dedup_ratio_median=statistics.median(ratios) if ratios else nan,
        dedup_ratio_max=max(ratios, default=nan),
        branches_median=statistics.median([t.branches for t in trees]) if trees else nan,
        branches_max=max((t.branches for t in trees), default=0),
        depth_max=max((t.depth for t in trees), default=0),
    )
