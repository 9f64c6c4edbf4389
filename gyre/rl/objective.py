"""The per-micro-batch training objective: packed-tree logprobs -> masked PPO loss.

Owns `microbatch_loss`, the loss of one packed micro-batch before `backward()`, and
`PolicyObjective`, the same bound to an `RLConfig`: the `gyre.engines.Objective` a trainer is
built with. It gathers each loss token's advantage from its execution, keeps only tokens that are
fresh enough (per-token staleness from weight versions) and have a finite advantage, and returns
the weighted PPO loss. Summing `backward()` over a batch's micro-batches and then one guarded
step (`gyre.engines.trainer.step_if_finite`) is one optimizer step. Knows nothing about how
batches are formed, optimizers or DeepSpeed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from gyre.config import RLConfig
from gyre.kernels.cached_tree_attention import ChunkAttention
from gyre.kernels.selective_logprob import LogprobImpl
from gyre.rl.loss import LossStatistics, policy_loss
from gyre.rl.packed_forward import packed_logprobs
from gyre.rl.staleness import stale_token_mask
from gyre.trajectory.pack import PackedBatch

__all__ = ["microbatch_loss", "PolicyObjective"]


def microbatch_loss(
    model: torch.nn.Module,
    batch: PackedBatch,
    advantages: Mapping[str, float | None],
    *,
    trainer_version: int,
    max_staleness: int,
    clip_eps: float = 0.2,
    is_cap: float = 2.0,
    temperature: float | None = None,
    chunk_size: int = 1024,
    impl: LogprobImpl = "torch",
    attention: ChunkAttention | None = None,
) -> tuple[torch.Tensor, LossStatistics]:
    """Loss of one packed micro-batch (scalar tensor) and its statistics.

    `advantages` maps every execution id of the batch to its advantage (None: failed, no loss).
    Tokens older than `max_staleness` versions (or newer than the trainer) are masked out by
    selection; their loss weight is not redistributed. Tokens are scored at their own sampling
    temperature unless `temperature` overrides it. `chunk_size` and `impl` (logprob kernel) and
    `attention` (tree attention; None: from the model) go to `packed_logprobs`. Raises
    `ValueError` when an execution of the batch has no entry in `advantages` (and whatever
    `packed_logprobs` raises).
    """
    missing = [e for e in batch.execution_ids if e not in advantages]
    if missing:
        raise ValueError(f"no advantage for executions {missing}")
    positions = batch.loss_positions()
    logprob_N, _ = packed_logprobs(
        model,
        batch,
        positions_N=positions,
        temperature=temperature,
        chunk_size=chunk_size,
        impl=impl,
        attention=attention,
    )
    device, dtype = logprob_N.device, logprob_N.dtype
    adv_E = torch.tensor(
        [float("nan") if advantages[e] is None else advantages[e] for e in batch.execution_ids],
        dtype=dtype,
        device=device,
    )
    execution_N = torch.as_tensor(batch.execution_T[positions], device=device).long()
    advantage_N = adv_E[execution_N]
    version_N = torch.as_tensor(batch.version_T[positions], device=device)
    fresh_N = stale_token_mask(version_N, trainer_version, max_staleness)
    mask_N = fresh_N & torch.isfinite(advantage_N)
    return policy_loss(
        logprob_N,
        torch.as_tensor(batch.behaviour_logprob_T[positions], device=device),
        advantage_N,
        torch.as_tensor(batch.loss_weight_T[positions], device=device),
        mask_N,
        clip_eps=clip_eps,
        is_cap=is_cap,
        same_version_N=version_N == trainer_version,
    )


@dataclass(frozen=True)
class PolicyObjective:
    """The policy loss as a trainer's objective (`gyre.engines.Objective`): `microbatch_loss` with
    the clip range, IS cap, staleness bound and logprob chunk of `rl`, each token scored at its
    call's own sampling temperature (B05)."""

    rl: RLConfig
    """The policy-loss settings."""

    def __call__(
        self,
        model: torch.nn.Module,
        batch: PackedBatch,
        advantages: Mapping[str, float | None],
        *,
        version: int,
        attention: ChunkAttention = "sdpa",
        logprob_impl: LogprobImpl = "torch",
    ) -> tuple[torch.Tensor, LossStatistics]:
        """`microbatch_loss(model, batch, advantages, trainer_version=version, ...)`: a scalar loss
        tensor (the model's float dtype) and its `LossStatistics`; the trainer's `attention` and
        `logprob_impl` (`TrainerConfig`) choose the kernels. Raises what it raises."""
        return microbatch_loss(
            model,
            batch,
            advantages,
            trainer_version=version,
            max_staleness=self.rl.max_staleness,
            clip_eps=self.rl.clip_eps,
            is_cap=self.rl.is_cap,
            chunk_size=self.rl.logprob_chunk_size,
            impl=logprob_impl,
            attention=attention,
        )
