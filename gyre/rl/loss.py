"""The policy loss: PPO-clip with a truncated importance-sampling cap, masked by selection.

Owns `policy_loss`, `masked_token_mean` and `LossStatistics`. Masking is by selection (boolean
indexing before any arithmetic), never by multiplying with a 0/1 mask, so a NaN or inf at a
masked position cannot reach the loss or its gradient (B09). The log-ratio is bounded above
before `exp` (`log_ratio_bound`), so one token far off-policy cannot overflow `exp` into a NaN
gradient (issue 18). Which tokens are masked (selection, staleness, failed executions) is decided
by the caller. Knows nothing about trees, models or optimizers: it takes per-token tensors.

Shape suffix legend: `N` candidate loss tokens (e.g. the policy tokens of a packed micro-batch).
"""

from __future__ import annotations

import math

import msgspec
import torch

__all__ = ["LossStatistics", "policy_loss", "masked_token_mean", "log_ratio_bound"]

LOG_RATIO_MARGIN = 1.0
"""Nats between log(is_cap) and the log-ratio bound: exp(bound) = e * is_cap stays above the cap
after rounding in any float dtype, so a bounded ratio is still capped and clipped."""


class LossStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What one `policy_loss` call saw (floats are plain Python numbers, NaN when no token)."""

    tokens: int
    """Tokens that carried loss (mask True)."""
    masked_tokens: int
    """Candidate tokens left out by the mask (stale, unselected, failed execution)."""
    clip_fraction: float
    """Fraction of loss tokens whose clipped term was the active one (no gradient)."""
    is_capped_fraction: float
    """Fraction of loss tokens whose ratio exceeded `is_cap`."""
    mean_ratio: float
    """Mean importance ratio pi_theta / pi_behaviour over loss tokens (after `log_ratio_bound`)."""
    mean_abs_logprob_diff: float
    """Mean |trainer logprob - behaviour logprob| over loss tokens: the B07 mismatch metric."""
    same_version_tokens: int = 0
    """Loss tokens sampled by the trainer's own weight version (`same_version_N`)."""
    same_version_abs_logprob_diff: float = float("nan")
    """Mean |trainer logprob - behaviour logprob| over those: numerics alone (engine against
    trainer on the same weights), apart from the drift of stale tokens (off-policy)."""


def masked_token_mean(loss_N: torch.Tensor, mask_N: torch.Tensor) -> torch.Tensor:
    """sum(loss_N[mask_N]) / count(mask_N); 0 (not NaN) when nothing is selected.

    Any shape (`mask_N` bool, same shape). Masked entries may be NaN or inf: they are never read,
    so their gradient is exactly 0. Raises `ValueError` for a non-bool mask or mismatched shapes.
    """
    if mask_N.dtype != torch.bool or mask_N.shape != loss_N.shape:
        raise ValueError(
            f"mask must be bool with shape {tuple(loss_N.shape)}, "
            f"got {mask_N.dtype} {tuple(mask_N.shape)}"
        )
    selected = loss_N[mask_N]
    return selected.sum() / max(int(selected.numel()), 1)


def log_ratio_bound(is_cap: float, dtype: torch.dtype) -> float:
    """The upper bound applied to the log-ratio before `exp`: log(is_cap) + `LOG_RATIO_MARGIN`.

    Why a bound: exp overflows past log(finfo.max) (88.72 in float32 and bfloat16, 11.09 in
    float16); the clamp on the ratio then has a zero gradient, but autograd multiplies that zero
    by exp's derivative, inf, and 0 * inf is NaN: one such token made the whole step's gradient
    NaN. Why this bound changes nothing: every ratio above `is_cap` gives the same term (capped
    at `is_cap` for A < 0, clipped at 1 + clip_eps for A >= 0) with zero gradient, and
    exp(bound) = e * is_cap > is_cap, so loss and gradient equal the unbounded formula's wherever
    that one is finite. No lower bound: exp underflows to 0 with a zero gradient, which is finite,
    and bounding below would change the term -r * A of a token with A > 0 and tiny r.
    Raises `ValueError` when exp(bound) is not finite in `dtype` (an `is_cap` near its max).
    """
    bound = math.log(is_cap) + LOG_RATIO_MARGIN
    if dtype.is_floating_point and bound >= math.log(torch.finfo(dtype).max):
        raise ValueError(
            f"is_cap={is_cap} is too large for {dtype}: exp(log(is_cap) + 1) overflows"
        )
    return bound


def policy_loss(
    logprob_N: torch.Tensor,
    behaviour_logprob_N: torch.Tensor,
    advantage_N: torch.Tensor,
    weight_N: torch.Tensor,
    mask_N: torch.Tensor,
    *,
    clip_eps: float = 0.2,
    is_cap: float = 2.0,
    same_version_N: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStatistics]:
    """Weighted sum over selected tokens of the dual-clipped PPO term; returns (loss, statistics).

    For a token with ratio r = exp(logprob - behaviour_logprob) and advantage A:
    term = -min(min(r, is_cap) * A, clip(r, 1 - clip_eps, 1 + clip_eps) * A)
    (PPO-clip, Schulman et al. 2017; the truncated IS cap bounds r for negative advantages as in
    dual-clip PPO, Ye et al. 2020). loss = sum over mask_N of weight_N * term: the weights already
    hold the per-execution and per-batch means (`gyre.trajectory.pack`), so summing micro-batch
    losses gives the batch loss. All inputs are [N]; `mask_N` bool; logprobs in nats;
    `same_version_N` (bool [N], optional) marks the tokens sampled by the trainer's weight version,
    whose mismatch is reported apart (`LossStatistics.same_version_abs_logprob_diff`). The
    log-ratio is bounded above by `log_ratio_bound` before `exp`: loss and gradients are finite for
    any finite logprobs (and a behaviour logprob of -inf, whose ratio is then capped), and equal
    the unbounded formula's wherever that one is finite.
    Raises `ValueError` for mismatched shapes, `clip_eps` outside (0, 1), `is_cap < 1 + clip_eps`,
    or a selected behaviour logprob that is NaN or +inf (no sampled token has either: the record
    is corrupt, and training on it would be wrong whatever the bound).
    """
    n = logprob_N.shape
    for name, t in (
        ("behaviour_logprob_N", behaviour_logprob_N),
        ("advantage_N", advantage_N),
        ("weight_N", weight_N),
        ("mask_N", mask_N),
    ):
        if t.shape != n:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(n)}")
    if mask_N.dtype != torch.bool:
        raise ValueError(f"mask_N must be bool, got {mask_N.dtype}")
    if not 0 < clip_eps < 1:
        raise ValueError(f"clip_eps={clip_eps} must be in (0, 1)")
    if is_cap < 1 + clip_eps:
        raise ValueError(f"is_cap={is_cap} must be >= 1 + clip_eps = {1 + clip_eps}")
    lp = logprob_N[mask_N]
    blp = behaviour_logprob_N[mask_N].to(lp.dtype)
    adv = advantage_N[mask_N].to(lp.dtype)
    w = weight_N[mask_N].to(lp.dtype)
    bad = torch.isnan(blp) | torch.isposinf(blp)
    if bool(bad.any()):
        raise ValueError(
            f"{int(bad.sum())} selected behaviour logprobs are NaN or +inf "
            f"(first: {float(blp[bad][0])}); behaviour logprobs must be <= 0"
        )
    log_ratio = torch.clamp(lp - blp, max=log_ratio_bound(is_cap, lp.dtype))
    ratio = torch.exp(log_ratio)
    unclipped = torch.clamp(ratio, max=is_cap) * adv
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv
    term = -torch.minimum(unclipped, clipped)
    loss = (w * term).sum()
    tokens = int(lp.numel())

    def mean(x: torch.Tensor) -> float:
        return float(x.double().mean()) if tokens else float("nan")

    with torch.no_grad():
        diff = (lp - blp).abs()
        same = None if same_version_N is None else same_version_N.to(mask_N.device)[mask_N]
        same_tokens = 0 if same is None else int(same.sum())
        stats = LossStatistics(
            tokens=tokens,
            masked_tokens=int(mask_N.numel()) - tokens,
            clip_fraction=mean(clipped < unclipped),
            is_capped_fraction=mean(ratio > is_cap),
            mean_ratio=mean(ratio),
            mean_abs_logprob_diff=mean(diff),
            same_version_tokens=same_tokens,
            same_version_abs_logprob_diff=float(diff[same].double().mean())
            if same_tokens
            else float("nan"),
        )
    return loss, stats
