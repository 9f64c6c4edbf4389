"""Reinforcement learning on packed trajectory trees: advantages, the policy loss, the step guard.

A trainer step: `group_advantages` per group (failed executions excluded), trees packed by
`gyre.trajectory`, per micro-batch `microbatch_loss(...)` then `backward()`, then
`step_if_finite(optimizer)` (skips the step everywhere if any gradient is non-finite).
Building blocks: `packed_logprobs`, `policy_loss`, `stale_token_mask`, `mixed_version_calls`.
"""

from gyre.rl.advantages import GroupAdvantages, group_advantages, reward_of
from gyre.rl.loss import LossStatistics, masked_token_mean, policy_loss
from gyre.rl.packed_forward import packed_logprobs
from gyre.rl.staleness import mixed_version_calls, stale_token_mask
from gyre.rl.objective import microbatch_loss
from gyre.rl.step import grads_finite, step_if_finite

__all__ = [
    "GroupAdvantages",
    "group_advantages",
    "reward_of",
    "packed_logprobs",
    "LossStatistics",
    "policy_loss",
    "masked_token_mean",
    "stale_token_mask",
    "mixed_version_calls",
    "microbatch_loss",
    "grads_finite",
    "step_if_finite",
]
