"""Reinforcement learning on packed trajectory trees: advantages, the policy loss, the objective.

A trainer step: `group_advantages` per group (failed executions excluded), trees packed by
`gyre.trajectory`, then a trainer built with `PolicyObjective(rl_config)` calls it per
micro-batch (`microbatch_loss(...)`) before `backward()`, and steps only on finite gradients
(the guard lives with the trainer, `gyre.engines.trainer`). Building blocks: `packed_logprobs`
(the packed forward), `policy_loss`, `stale_token_mask`, `mixed_version_calls`. Knows nothing
about optimizers or DeepSpeed.
"""

from gyre.rl.advantages import GroupAdvantages, group_advantages, reward_of
from gyre.rl.loss import LossStatistics, masked_token_mean, policy_loss
from gyre.rl.objective import PolicyObjective, microbatch_loss
from gyre.rl.packed_forward import check_context, packed_logprobs
from gyre.rl.staleness import mixed_version_calls, stale_token_mask

__all__ = [
    "GroupAdvantages",
    "group_advantages",
    "reward_of",
    "packed_logprobs",
    "check_context",
    "LossStatistics",
    "policy_loss",
    "masked_token_mean",
    "stale_token_mask",
    "mixed_version_calls",
    "microbatch_loss",
    "PolicyObjective",
]
