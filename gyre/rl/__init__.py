"""Reinforcement learning on packed trajectory trees: advantages, the policy loss, the step guard.

`group_advantages` (group baseline, failed executions excluded), `microbatch_loss` (packed-tree
logprobs -> masked, staleness-checked PPO loss), `packed_logprobs`, `policy_loss`,
`step_if_finite` (skip the optimizer step when any gradient is non-finite).
"""

from gyre.rl.advantages import GroupAdvantages, group_advantages, reward_of
from gyre.rl.logprobs import packed_logprobs
from gyre.rl.loss import LossStatistics, masked_token_mean, policy_loss
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
