"""From executions to one training batch: trees, Jmax selection, group advantages, packing.

Owns `TrainingBatch`, `build_training_batch` and `group_batch` (one group, as the runtime builds
it). Every execution of the step is accounted for once: failed ones (infrastructure), ones with no
sampled token, and ones with greedy or truncated (top-k / top-p) calls, whose behaviour distribution
the trainer does not reproduce (docs/design.md invariant 2), get no advantage and stay out of the
baselines and the loss; the others (finished or partially scored) are trained. Knows nothing about
engines, processes or optimizers.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from gyre.config import RunConfig, TrajectoryConfig
from gyre.rl import group_advantages, reward_of
from gyre.rollout.source import Executed
from gyre.trajectory.pack import PackedBatch, pack_batch
from gyre.trajectory.select import select_trajectories
from gyre.trajectory.tree import TreeStatistics, build_tree

__all__ = ["TrainingBatch", "build_training_batch", "group_batch"]


class TrainingBatch(msgspec.Struct, frozen=True, kw_only=True):
    """The micro-batches of one step and what went into them."""

    micro_batches: list[PackedBatch]
    advantages: dict[str, float | None]
    """Every execution of the step -> its advantage (None: no loss)."""
    trained_executions: int
    excluded: dict[str, str]
    """Execution id -> why it carries no loss (`failed: ...`, `no tokens`, `greedy ...`,
    `truncated ...`)."""
    policy_tokens: int
    """Selected policy tokens, each shared token once."""
    packed_tokens: int
    linear_tokens: int
    """Tokens the selected trajectories would cost run one by one (shared prefixes repeated)."""
    trees: dict[str, TreeStatistics] = {}
    """Trained execution id -> the statistics of its whole trajectory tree (before Jmax)."""


def _exclusion(ex: Executed) -> str | None:
    if ex.outcome.failed:
        return f"failed: {ex.outcome.failure_reason}"
    if not any(c.completion_ids for c in ex.calls):
        return "no tokens"
    if any(c.sampling.temperature == 0 for c in ex.calls):
        return "greedy calls (temperature 0): no sampling distribution to train"
    if any(c.sampling.top_p < 1 or c.sampling.top_k > 0 or c.sampling.min_p > 0 for c in ex.calls):
        return (
            "truncated sampling (top_p < 1, top_k > 0 or min_p > 0): refused for training "
            "(invariant 2)"
        )
    return None


def build_training_batch(
    groups: Sequence[Sequence[Executed]],
    *,
    trajectory: TrajectoryConfig,
    num_executions: int | None = None,
    stop_penalty: float = 0.0,
) -> TrainingBatch | None:
    """One batch from the step's groups (one group per task). None if nothing is trainable.

    `num_executions` is the loss denominator (executions the step averages over); default: the
    trainable executions of `groups`. A streaming step trains a batch group by group and passes
    the whole batch's size, so each execution weighs the same in every part. `stop_penalty`
    (`RLConfig.stop_penalty`) is taken off the reward of an execution stopped at a limit."""
    advantages: dict[str, float | None] = {}
    excluded: dict[str, str] = {}
    trainable: list[Executed] = []
    for group in groups:
        rewards = []
        for ex in group:
            reason = _exclusion(ex)
            if reason is not None:
                excluded[ex.outcome.execution_id] = reason
            else:
                trainable.append(ex)
            rewards.append(
                None if reason is not None else reward_of(ex.outcome, stop_penalty=stop_penalty)
            )
        advantages.update(
            group_advantages([ex.outcome.execution_id for ex in group], rewards).as_dict()
        )
    if not trainable:
        return None
    items = []
    linear = 0
    trees: dict[str, TreeStatistics] = {}
    for ex in trainable:
        tree = build_tree(ex.calls)
        trees[ex.outcome.execution_id] = tree.statistics()
        selection = select_trajectories(tree, trajectory.jmax, role_limits=trajectory.role_limits)
        items.append((tree, selection))
        linear += sum(len(tree.path(int(leaf))) for leaf in selection.leaves)
    micro_batches = pack_batch(
        items,
        token_budget=trajectory.micro_batch_tokens,
        num_executions=len(items) if num_executions is None else num_executions,
    )
    return TrainingBatch(
        micro_batches=micro_batches,
        advantages=advantages,
        trained_executions=len(trainable),
        excluded=excluded,
        policy_tokens=sum(sel.policy_tokens for _, sel in items),
        packed_tokens=sum(mb.num_tokens for mb in micro_batches),
        linear_tokens=linear,
        trees=trees,
    )


def group_batch(
    members: Sequence[Executed], config: RunConfig, num_executions: int
) -> TrainingBatch | None:
    """A complete group's batch as the runtime trains it (and rebuilds it on `--resume`):
    `build_training_batch` of the one group under `config`'s trajectory settings and
    `rl.stop_penalty`, each execution weighted 1 / `num_executions` (the step's batch size).
    Raises what `build_training_batch` raises (`ValueError` for a group with duplicate execution
    IDs or a non-finite score)."""
    return build_training_batch(
        [members],
        trajectory=config.trajectory,
        num_executions=num_executions,
        stop_penalty=config.rl.stop_penalty,
    )
