"""One step's training data: executions with rewards -> trees -> advantages -> packed micro-batches.

Owns `ExecutionSample` (what the scorer hands over per execution), `TrainingBatch` and
`build_training_batch`, which applies the admission rules in one place: an execution that failed
(reward None), made no model call, has no policy token in its selected trajectories (e.g. every
call aborted before its first token, B20) or, with version mixing disallowed, has a call sampled
under several weight versions (B11) is excluded with a reason; it counts neither in its group's
baseline nor in the per-batch mean. Knows nothing about models or optimizers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from gyre.rl.advantages import group_advantages
from gyre.rl.staleness import mixed_version_calls
from gyre.tito.records import ModelCall
from gyre.trajectory.pack import PackedBatch, pack_batch
from gyre.trajectory.select import Selection, select_trajectories
from gyre.trajectory.tree import TrajectoryTree, TreeStatistics, build_tree

__all__ = ["ExecutionSample", "TrainingBatch", "build_training_batch"]


class ExecutionSample(msgspec.Struct, frozen=True, kw_only=True):
    """One finished, timed-out (partially scored) or failed execution with its model calls."""

    execution_id: str
    group_id: str
    """The group (task) whose executions share a baseline."""
    reward: float | None
    """Full or partial score; None when the execution failed (see `gyre.rl.reward_of`)."""
    calls: list[ModelCall]


class TrainingBatch(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a trainer needs for one optimizer step."""

    micro_batches: list[PackedBatch]
    advantages: dict[str, float | None]
    """Per execution id; None for excluded executions."""
    baselines: dict[str, float | None]
    """Per group id; None when no execution of the group is trainable."""
    excluded: dict[str, str]
    """Execution id -> why it carries no loss."""
    tree_statistics: dict[str, TreeStatistics]
    """Per execution id with at least one call."""
    trained_executions: int
    """Executions packed into `micro_batches` (the divisor of every loss weight)."""


def build_training_batch(
    samples: Sequence[ExecutionSample], *, jmax: int, token_budget: int,
    role_limits: Mapping[str, int] | None = None, allow_version_mixing: bool = True,
) -> TrainingBatch:
    """Build trees, select at most `jmax` trajectories each, compute group advantages over the
    admitted executions and pack them (in `samples` order) into micro-batches of at most
    `token_budget` tokens (see `gyre.trajectory.pack_batch`).

    Raises `ValueError` for duplicate execution ids (and whatever the builders raise for bad
    records). `micro_batches` is empty when nothing is trainable.
    """
    ids = [s.execution_id for s in samples]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate execution ids in {ids}")
    excluded: dict[str, str] = {}
    chosen: dict[str, tuple[TrajectoryTree, Selection]] = {}
    stats: dict[str, TreeStatistics] = {}
    for s in samples:
        if not s.calls:
            excluded[s.execution_id] = "no model calls"
            continue
        tree = build_tree(s.calls)
        stats[s.execution_id] = tree.statistics()
        selection = select_trajectories(tree, jmax, role_limits=role_limits)
        mixed = [] if allow_version_mixing else mixed_version_calls(s.calls)
        if s.reward is None:
            excluded[s.execution_id] = "failed"
        elif selection.policy_tokens == 0:
            excluded[s.execution_id] = "no policy tokens in the selected trajectories"
        elif mixed:
            excluded[s.execution_id] = f"calls {mixed} mix weight versions"
        else:
            chosen[s.execution_id] = (tree, selection)
    groups: dict[str, list[ExecutionSample]] = {}
    for s in samples:
        groups.setdefault(s.group_id, []).append(s)
    advantages: dict[str, float | None] = {}
    baselines: dict[str, float | None] = {}
    for group_id, members in groups.items():
        result = group_advantages(
            [m.execution_id for m in members],
            [m.reward if m.execution_id in chosen else None for m in members],
        )
        baselines[group_id] = result.baseline
        advantages.update(result.as_dict())
    items = [chosen[e] for e in ids if e in chosen]
    micro = pack_batch(items, token_budget=token_budget) if items else []
    return TrainingBatch(
        micro_batches=micro,
        advantages=advantages,
        baselines=baselines,
        excluded=excluded,
        tree_statistics=stats,
        trained_executions=len(items),
    )
