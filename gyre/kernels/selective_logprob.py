"""Fused selective logprob + entropy: the LM head evaluated only where a loss needs it (B24).

Owns `selective_logprob_entropy` (impl="torch" | "triton") and its plain reference
`selective_logprob_entropy_reference`. The caller gathers the hidden rows of the N positions whose
next token carries loss (in a packed tree: each policy token's *parent*); the head `W` is applied
to chunks of `chunk_size` rows, so forward and backward need O(chunk_size x V) extra memory, never
O(N x V): the backward recomputes each chunk's logits from the saved rows and per-row log-sum-exp.
`impl="triton"` reduces a chunk with `gyre.kernels.selective_logprob_triton` (on CPU only under
TRITON_INTERPRET=1), sharing the chunked matmul and backward. Knows nothing about trees, models or
losses. Shape suffix legend: `N` selected positions, `H` hidden, `V` vocabulary, `C` chunk rows.
"""

from __future__ import annotations

from typing import Literal

import torch

__all__ = ["selective_logprob_entropy", "selective_logprob_entropy_reference", "LogprobImpl"]

LogprobImpl = Literal["torch", "triton"]


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _chunk_logits(h_CH: torch.Tensor, w_VH: torch.Tensor, temp_C: torch.Tensor) -> torch.Tensor:
    dtype = _compute_dtype(h_CH.dtype)
    return (h_CH.to(dtype) @ w_VH.to(dtype).T) / temp_C[:, None]


def _reduce_torch(x_CV: torch.Tensor, labels_C: torch.Tensor) -> tuple[torch.Tensor, ...]:
    lse_C = torch.logsumexp(x_CV, dim=-1)
    lp_C = x_CV.gather(1, labels_C[:, None]).squeeze(1) - lse_C
    p_CV = torch.exp(x_CV - lse_C[:, None])
    ent_C = lse_C - (p_CV * x_CV).sum(-1)
    return lp_C, ent_C, lse_C


class _SelectiveLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden_NH, weight_VH, labels_N, temp_N, chunk_size, impl):
        n = hidden_NH.shape[0]
        dtype = _compute_dtype(hidden_NH.dtype)
        lp_N = torch.empty(n, dtype=dtype, device=hidden_NH.device)
        ent_N = torch.empty_like(lp_N)
        lse_N = torch.empty_like(lp_N)
        for lo in range(0, n, chunk_size):
            sl = slice(lo, min(lo + chunk_size, n))
            x_CV = _chunk_logits(hidden_NH[sl], weight_VH, temp_N[sl])
            if impl == "triton":
                from gyre.kernels.selective_logprob_triton import triton_logprob_entropy

                lp_N[sl], ent_N[sl], lse_N[sl] = triton_logprob_entropy(x_CV, labels_N[sl])
            else:
                lp_N[sl], ent_N[sl], lse_N[sl] = _reduce_torch(x_CV, labels_N[sl])
        ctx.save_for_backward(hidden_NH, weight_VH, labels_N, lse_N, temp_N)
        ctx.chunk_size = chunk_size
        return lp_N, ent_N

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_lp_N, g_ent_N):
        hidden_NH, weight_VH, labels_N, lse_N, temp_N = ctx.saved_tensors
        chunk_size = ctx.chunk_size
        n = hidden_NH.shape[0]
        dtype = lse_N.dtype
        if g_lp_N is None:
            g_lp_N = torch.zeros_like(lse_N)
        if g_ent_N is None:
            g_ent_N = torch.zeros_like(lse_N)
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        device = hidden_NH.device
        g_hidden_NH = torch.zeros(hidden_NH.shape, dtype=dtype, device=device) if need_h else None
        g_weight_VH = torch.zeros(weight_VH.shape, dtype=dtype, device=device) if need_w else None
        w_VH = weight_VH.to(dtype)
        for lo in range(0, n, chunk_size):
            sl = slice(lo, min(lo + chunk_size, n))
            h_CH = hidden_NH[sl].to(dtype)
            x_CV = (h_CH @ w_VH.T) / temp_N[sl, None]
            p_CV = torch.exp(x_CV - lse_N[sl, None])
            mean_x_C = (p_CV * x_CV).sum(-1)  # E_p[x], recomputed: lse - entropy would cancel
            # d lp / dx = onehot - p ; d entropy / dx = -p * (x - E_p[x])
            g_x_CV = -p_CV * (g_lp_N[sl, None] + g_ent_N[sl, None] * (x_CV - mean_x_C[:, None]))
            g_x_CV.scatter_add_(1, labels_N[sl, None], g_lp_N[sl, None].to(dtype))
            g_x_CV /= temp_N[sl, None]
            if need_h:
                g_hidden_NH[sl] = g_x_CV @ w_VH
            if need_w:
                g_weight_VH += g_x_CV.T @ h_CH
        return (
            None if g_hidden_NH is None else g_hidden_NH.to(hidden_NH.dtype),
            None if g_weight_VH is None else g_weight_VH.to(weight_VH.dtype),
            None,
            None,
            None,
            None,
        )


def selective_logprob_entropy(
    hidden_NH: torch.Tensor,
    weight_VH: torch.Tensor,
    labels_N: torch.Tensor,
    *,
    temperature: float | torch.Tensor = 1.0,
    chunk_size: int = 1024,
    impl: LogprobImpl = "torch",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprob of `labels_N` and entropy (nats) of softmax(hidden_NH @ weight_VH.T / temperature).

    `temperature` is one float or a tensor [N] (each row's sampling temperature, B05: applied to
    the logits, not to the logprobs).

    `hidden_NH` [N, H] (any float dtype) are the rows that predict `labels_N` [N] (int64);
    `weight_VH` [V, H] the LM head (no bias). Returns (logprob_N, entropy_N) in float32, or in
    float64 for float64 input. Differentiable w.r.t. `hidden_NH` and `weight_VH`; extra memory
    O(chunk_size x V) in forward and backward. Raises `ValueError` for mismatched shapes,
    `temperature <= 0`, `chunk_size < 1`, labels outside [0, V) or an unknown `impl`.
    """
    if impl not in ("torch", "triton"):
        raise ValueError(f"impl={impl!r} must be 'torch' or 'triton'")
    if hidden_NH.ndim != 2 or weight_VH.ndim != 2 or hidden_NH.shape[1] != weight_VH.shape[1]:
        raise ValueError(
            f"hidden_NH {tuple(hidden_NH.shape)} and weight_VH {tuple(weight_VH.shape)} "
            "must be [N, H] and [V, H]"
        )
    if labels_N.shape != (hidden_NH.shape[0],):
        raise ValueError(f"labels_N shape {tuple(labels_N.shape)} must be ({hidden_NH.shape[0]},)")
    dtype = _compute_dtype(hidden_NH.dtype)
    temp_N = torch.as_tensor(temperature, dtype=dtype, device=hidden_NH.device)
    temp_N = temp_N.expand(hidden_NH.shape[0])
    if temp_N.numel() and not bool((temp_N > 0).all()):
        raise ValueError(f"temperature={temperature} must be > 0 (greedy has no logprobs to train)")
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be >= 1")
    if labels_N.numel() and (int(labels_N.min()) < 0 or int(labels_N.max()) >= weight_VH.shape[0]):
        raise ValueError(
            f"labels_N must lie in [0, {weight_VH.shape[0]}), "
            f"got min {int(labels_N.min())} max {int(labels_N.max())}"
        )
    return _SelectiveLogprob.apply(
        hidden_NH, weight_VH, labels_N.long(), temp_N.contiguous(), int(chunk_size), impl
    )


def selective_logprob_entropy_reference(
    hidden_NH: torch.Tensor,
    weight_VH: torch.Tensor,
    labels_N: torch.Tensor,
    *,
    temperature: float | torch.Tensor = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unchunked plain-torch reference (materialises [N, V]); same contract as the fused version."""
    dtype = _compute_dtype(hidden_NH.dtype)
    temp_N1 = torch.as_tensor(temperature, dtype=dtype).expand(hidden_NH.shape[0])[:, None]
    logits_NV = (hidden_NH.to(dtype) @ weight_VH.to(dtype).T) / temp_N1
    logp_NV = torch.log_softmax(logits_NV, dim=-1)
    lp_N = logp_NV.gather(1, labels_N.long()[:, None]).squeeze(1)
    ent_N = -(logp_NV.exp() * logp_NV).sum(-1)
    return lp_N, ent_N
