"""Tree attention: each packed token attends exactly to the tokens on its own root path.

Owns `tree_mask` (the dense boolean mask), `tree_block_mask` (a FlexAttention `BlockMask` built
from the same rule), `model_attention_mask` (what to pass to a Hugging Face model as
`attention_mask` for a given attention implementation) and `tree_attention` with
`impl="sdpa" | "flex" | "reference"`. The rule, with packed tokens in DFS preorder
(`dfs_in = arange(T)`): key k is visible to query q iff `k <= q < dfs_out[k]`, i.e. k is an
ancestor of q or q itself. Knows nothing about trees, calls or losses; only `dfs_out_T`.

Backends (`docs/notes/kernels.md`): SDPA with a 4D boolean mask is exact on CPU,
forward and backward; FlexAttention is exact but forward-only on CPU (its backward raises
NotImplementedError there), so `flex` is the GPU training path. transformers' *eager* attention
adds a boolean mask to the scores instead of masking, silently wrong: `model_attention_mask`
refuses it.

Shape suffix legend: `B` batch, `H` heads, `T` packed tokens, `Q` query tokens, `K` key tokens,
`D` head dim.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F

__all__ = [
    "tree_mask",
    "tree_block_mask",
    "model_attention_mask",
    "tree_attention",
    "AttentionImpl",
]

AttentionImpl = Literal["sdpa", "flex", "reference"]


def _check_dfs_out(dfs_out_T: torch.Tensor) -> None:
    if dfs_out_T.ndim != 1:
        raise ValueError(f"dfs_out_T must be 1-D, got shape {tuple(dfs_out_T.shape)}")
    t = dfs_out_T.shape[0]
    idx = torch.arange(t, device=dfs_out_T.device)
    if t and (bool((dfs_out_T <= idx).any()) or bool((dfs_out_T > t).any())):
        raise ValueError(
            f"dfs_out_T must satisfy i < dfs_out_T[i] <= T={t}, got {dfs_out_T.tolist()[:16]}..."
        )


def tree_mask(dfs_out_T: torch.Tensor) -> torch.Tensor:
    """Dense mask_QK (bool, [T, T], True = attend): `k <= q < dfs_out_T[k]`.

    `dfs_out_T` int64 [T]: exclusive end of each token's subtree in packed (DFS preorder) order.
    Memory: T*T bytes. Raises `ValueError` if `dfs_out_T` is not a valid interval array.
    """
    _check_dfs_out(dfs_out_T)
    idx_T = torch.arange(dfs_out_T.shape[0], device=dfs_out_T.device)
    return (idx_T[None, :] <= idx_T[:, None]) & (idx_T[:, None] < dfs_out_T[None, :])


def tree_block_mask(dfs_out_T: torch.Tensor, *, block_size: int = 128):
    """FlexAttention `BlockMask` for the same rule as `tree_mask` (blocks of `block_size`).

    Lives on `dfs_out_T.device`; fully masked blocks are skipped by the kernel.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    _check_dfs_out(dfs_out_T)
    out_T = dfs_out_T

    def mask_mod(b, h, q, kv):
        return (kv <= q) & (q < out_T[kv])

    t = out_T.shape[0]
    return create_block_mask(mask_mod, None, None, t, t, device=out_T.device, BLOCK_SIZE=block_size)


def model_attention_mask(dfs_out_T: torch.Tensor, attn_implementation: str):
    """What to pass as `attention_mask` to a Hugging Face decoder for one packed sequence.

    `sdpa`: a bool tensor [1, 1, T, T] (passed through untouched by transformers);
    `flex_attention`: a `BlockMask`. Raises `ValueError` for `eager` (it would add the boolean
    mask to the scores: silently wrong) and for any other implementation.
    """
    if attn_implementation == "sdpa":
        return tree_mask(dfs_out_T)[None, None]
    if attn_implementation == "flex_attention":
        return tree_block_mask(dfs_out_T)
    raise ValueError(
        f"attn_implementation={attn_implementation!r} is not supported for tree attention: use "
        "'sdpa' (CPU and GPU) or 'flex_attention' (GPU training, CPU forward only); 'eager' treats "
        "a boolean 4D mask as additive and is silently wrong"
    )


def tree_attention(
    q_BHTD: torch.Tensor,
    k_BHTD: torch.Tensor,
    v_BHTD: torch.Tensor,
    dfs_out_T: torch.Tensor,
    *,
    impl: AttentionImpl = "sdpa",
) -> torch.Tensor:
    """Scaled dot-product attention under the tree rule; returns out_BHTD (dtype of q).

    Scale 1/sqrt(D). `impl`: `sdpa` (dense bool mask, any device, differentiable), `flex`
    (BlockMask; differentiable on GPU only), `reference` (explicit softmax, for tests).
    Raises `ValueError` for an unknown `impl` or a bad `dfs_out_T`.
    """
    if impl == "sdpa":
        mask_QK = tree_mask(dfs_out_T)
        return F.scaled_dot_product_attention(q_BHTD, k_BHTD, v_BHTD, attn_mask=mask_QK)
    if impl == "flex":
        from torch.nn.attention.flex_attention import flex_attention

        return flex_attention(q_BHTD, k_BHTD, v_BHTD, block_mask=tree_block_mask(dfs_out_T))
    if impl == "reference":
        scores_BHQK = q_BHTD @ k_BHTD.transpose(-1, -2) / math.sqrt(q_BHTD.shape[-1])
        scores_BHQK = scores_BHQK.masked_fill(~tree_mask(dfs_out_T), float("-inf"))
        return torch.softmax(scores_BHQK, dim=-1) @ v_BHTD
    raise ValueError(f"impl={impl!r} must be 'sdpa', 'flex' or 'reference'")
