"""Advantages: each execution's reward minus the baseline of its group (the executions of one task).

Owns `GroupAdvantages`, `group_advantages` and `reward_of`. The baseline is the mean reward over
the group's *trainable* executions: finished ones and ones stopped at a limit (timeout, ...),
which are trained with their partial score, less `rl.stop_penalty` when one is set. Executions
that failed for infrastructure reasons (reward None) are left out of the baseline and out of the
loss (advantage None). Knows nothing about trees, tokens or models; reads `gyre.tasks` outcomes
only through `reward_of`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import msgspec

__all__ = ["GroupAdvantages", "group_advantages", "reward_of"]


class GroupAdvantages(msgspec.Struct, frozen=True, kw_only=True):
    """One group's baseline and per-execution advantages, in the order given."""

    execution_ids: tuple[str, ...]
    baseline: float | None
    """Mean reward of the trainable executions; None when there are none."""
    advantages: tuple[float | None, ...]
    """reward - baseline; None for failed executions (they carry no loss)."""

    def as_dict(self) -> dict[str, float | None]:
        return dict(zip(self.execution_ids, self.advantages))


def reward_of(outcome: Any, *, stop_penalty: float = 0.0) -> float | None:
    """The reward of a `gyre.tasks.outcome.Outcome` (typed `Any`: `gyre.tasks` is a higher layer
    than `gyre.rl`): its (full or partial) score in [0, 1], minus `stop_penalty` when
    it was stopped at a limit (`Outcome.stopped`), so in [-1, 1]; None if failed. Raises
    `ValueError` for a `stop_penalty` outside [0, 1] (`gyre.config.RLConfig.stop_penalty` gives its
    source, DAPO's soft overlong punishment)."""
    if not 0.0 <= stop_penalty <= 1.0:
        raise ValueError(f"stop_penalty={stop_penalty} must be in [0, 1]")
    if outcome.termination == "failed" or outcome.score is None:
        return None
    penalty = stop_penalty if outcome.stopped else 0.0
    return float(outcome.score.score) - penalty


def group_advantages(
    execution_ids: Sequence[str], rewards: Sequence[float | None]
) -> GroupAdvantages:
    """Group-baseline advantages: A_i = r_i - mean_{j not failed} r_j (GRPO without std scaling).

    `rewards[i]` is None for a failed execution. Raises `ValueError` for an empty group, lengths
    that differ, duplicate ids, or a reward that is not finite.
    """
    if not execution_ids:
        raise ValueError("group_advantages needs at least one execution")
    if len(execution_ids) != len(rewards):
        raise ValueError(f"{len(execution_ids)} execution ids but {len(rewards)} rewards")
    if len(set(execution_ids)) != len(execution_ids):
        raise ValueError(f"duplicate execution ids in {list(execution_ids)}")
    kept = []
    for eid, r in zip(execution_ids, rewards):
        if r is not None:
            if not math.isfinite(r):
                raise ValueError(f"execution {eid!r}: reward={r!r} must be finite")
            kept.append(float(r))
    baseline = math.fsum(kept) / len(kept) if kept else None
    return GroupAdvantages(
        execution_ids=tuple(execution_ids),
        baseline=baseline,
        # baseline is None only when every reward is None
        advantages=tuple(
            None if r is None or baseline is None else float(r) - baseline for r in rewards
        ),
    )
