"""Tree attention over a packed tree forwarded in DFS chunks, each chunk reading its ancestors'
cached K/V: memory linear in tokens, no T x T mask.

Owns `TreeKVCache` (one tree's per-layer K/V, filled chunk by chunk during one forward),
`ancestor_paths` and `check_attention_backend`. The rule is `tree_attention.tree_mask`'s: key k is
visible to query q iff `k <= q < dfs_out[k]` (packed indices in DFS preorder). Because a subtree
is one interval, the keys any query of a contiguous block [a, b) can see are the strict ancestors
of a (its root path, at most the tree's depth) plus [a, b): each block attends to those keys only,
gathered from the cached K/V of the earlier chunks and its own, under a (b - a) x keys mask.

- `sdpa` (CPU and GPU): query blocks of `query_block` rows; each block's gather, mask and SDPA
  run under activation checkpointing, so backward keeps only the K/V and the index of the block's
  keys (not its probabilities or mask) and recomputes the block.
- `flex` (GPU training): one FlexAttention call per chunk over [ancestors of its first token ;
  the chunk] with a `BlockMask` built from the same rule (fully masked blocks skipped).

Gradients reach every cached K/V through the gathers, so one backward after all chunks is exact.
Knows nothing about models, trees or losses; the caller hands it `dfs_out_T` and the chunk cuts.
Shape suffix legend: `B` batch (1), `H` query heads, `G` K/V heads, `Q` chunk or block queries,
`K` keys of a block, `D` head dim, `T` packed tokens, `A` ancestors.
"""

from __future__ import annotations

import bisect
import os
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask

__all__ = [
    "TreeKVCache",
    "ancestor_paths",
    "check_attention_backend",
    "check_logprob_backend",
    "ChunkAttention",
]

ChunkAttention = Literal["sdpa", "flex"]


def check_attention_backend(attention: str, device: torch.device | str = "cpu") -> None:
    """Raise `ValueError` unless `attention` can train on `device`: `sdpa` anywhere; `flex` only
    on CUDA (FlexAttention's backward raises NotImplementedError on CPU)."""
    if attention not in ("sdpa", "flex"):
        raise ValueError(f"attention={attention!r} must be 'sdpa' or 'flex'")
    if attention == "flex" and torch.device(device).type != "cuda":
        raise ValueError(
            f"attention='flex' trains only on a CUDA device (FlexAttention has no backward on "
            f"{torch.device(device).type}); use attention='sdpa' here"
        )


def check_logprob_backend(impl: str, device: torch.device | str = "cpu") -> None:
    """Raise `ValueError` unless logprob `impl` runs on `device`: `torch` anywhere; `triton` on
    CUDA with the `triton` package, or on CPU only in Triton's interpreter (TRITON_INTERPRET=1)."""
    if impl not in ("torch", "triton"):
        raise ValueError(f"logprob_impl={impl!r} must be 'torch' or 'triton'")
    if impl == "triton":
        try:
            import triton  # noqa: F401
        except ImportError:
            raise ValueError("logprob_impl='triton' needs the triton package") from None
        kind = torch.device(device).type
        if kind != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                f"logprob_impl='triton' needs a CUDA device (or TRITON_INTERPRET=1 for tests), "
                f"the trainer runs on {kind}; use logprob_impl='torch' here"
            )


def ancestor_paths(dfs_out: list[int], starts: list[int]) -> list[list[int]]:
    """Strict ancestors (ascending packed indices) of each token in `starts` (ascending).

    `dfs_out` is the exclusive subtree end of each token (`dfs_out[i] > i`). One sweep over the
    tokens up to the last start with a stack of the open subtrees: O(T) time, O(depth) per path.
    """
    paths: list[list[int]] = []
    stack: list[int] = []
    nxt = 0
    for a in starts:
        while nxt < a:
            while stack and dfs_out[stack[-1]] <= nxt:
                stack.pop()
            stack.append(nxt)
            nxt += 1
        while stack and dfs_out[stack[-1]] <= a:
            stack.pop()
        paths.append(list(stack))
    return paths


def _gather(parts_GTD: list[torch.Tensor], picks: list[tuple[int, torch.Tensor]]) -> torch.Tensor:
    """Rows of the cached parts (each [B, G, len, D]) in order: cat of index_select per part."""
    return torch.cat([parts_GTD[j].index_select(2, local) for j, local in picks], dim=2)


def _block_attention(q_BHQD, k_parts, v_parts, picks, key_K, dfs_out_T, lo, scale):
    q_Q = torch.arange(lo, lo + q_BHQD.shape[2], device=q_BHQD.device)
    mask_QK = (key_K[None, :] <= q_Q[:, None]) & (q_Q[:, None] < dfs_out_T[key_K][None, :])
    return F.scaled_dot_product_attention(
        q_BHQD,
        _gather(k_parts, picks),
        _gather(v_parts, picks),
        attn_mask=mask_QK[None, None],
        scale=scale,
        enable_gqa=True,
    )


_compiled_flex: dict[bool, object] = {}
"""`flex_attention` compiled with dynamic shapes (CUDA: one kernel for every chunk length) and
with static ones (CPU: inductor's C++ code for dynamic flex shapes does not compile in torch
2.13, `cur_kvSplitSize` undeclared; the trainer refuses flex without CUDA, so the CPU path only
checks parity in tests)."""


def _flex(q, k, v, block_mask, scale):
    dynamic = q.is_cuda
    compiled = _compiled_flex.get(dynamic)
    if compiled is None:
        from torch.nn.attention.flex_attention import flex_attention

        compiled = _compiled_flex[dynamic] = torch.compile(flex_attention, dynamic=dynamic)
    return compiled(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True)


class TreeKVCache:
    """One tree's K/V during one chunked forward (`attention` `sdpa` or `flex`).

    Args:
        dfs_out_T: int64 [T] on the compute device, exclusive subtree ends (DFS preorder).
        chunk_starts: ascending packed indices where chunks begin (first 0); chunk c is
            [chunk_starts[c], chunk_starts[c+1] or T).
        attention: `sdpa` (query blocks, checkpointed) or `flex` (BlockMask per chunk).
        query_block: rows per SDPA query block (`sdpa` only; >= 1).

    Use: for each chunk in order `begin_chunk(c)`, then run the model; each attention layer calls
    `attend(layer, q, k, v, scale)` once. The cache holds references to every chunk's K/V (in the
    autograd graph) until it is dropped. Raises `ValueError` for bad cuts or `query_block < 1`.
    """

    def __init__(
        self,
        dfs_out_T: torch.Tensor,
        chunk_starts: list[int],
        *,
        attention: ChunkAttention = "sdpa",
        query_block: int = 512,
    ) -> None:
        t = int(dfs_out_T.shape[0])
        if (
            not chunk_starts
            or chunk_starts[0] != 0
            or any(b <= a for a, b in zip(chunk_starts, [*chunk_starts[1:], t]))
        ):
            raise ValueError(
                f"chunk_starts={chunk_starts[:8]} must start at 0 and rise strictly below T={t}"
            )
        if attention not in ("sdpa", "flex"):
            raise ValueError(f"attention={attention!r} must be 'sdpa' or 'flex'")
        if query_block < 1:
            raise ValueError(f"query_block={query_block} must be >= 1")
        self.dfs_out_T = dfs_out_T
        self.attention = attention
        self.query_block = query_block
        self.bounds = list(zip(chunk_starts, [*chunk_starts[1:], t]))
        self._dfs_out = dfs_out_T.tolist()
        self._k: dict[int, list[torch.Tensor]] = {}
        self._v: dict[int, list[torch.Tensor]] = {}
        self._chunk = -1
        self._plan: list[tuple[int, list[tuple[int, torch.Tensor]], torch.Tensor]] = []
        self._block_mask: BlockMask | None = None

    def _picks(self, keys: list[int]) -> tuple[list[tuple[int, torch.Tensor]], torch.Tensor]:
        """Keys (ascending packed indices, all in chunks <= the current one) as (part, local
        rows) pairs, and the keys as a tensor."""
        device = self.dfs_out_T.device
        key_K = torch.tensor(keys, dtype=torch.int64, device=device)
        picks = []
        i = 0
        for j, (lo, hi) in enumerate(self.bounds[: self._chunk + 1]):
            n = bisect.bisect_left(keys, hi, lo=i)
            if n > i:
                picks.append((j, key_K[i:n] - lo))
            i = n
        return picks, key_K

    def begin_chunk(self, chunk: int) -> tuple[int, int]:
        """Make `chunk` (the next one in order) current; returns its [lo, hi)."""
        if chunk != self._chunk + 1:
            raise ValueError(f"chunks run in order: expected {self._chunk + 1}, got {chunk}")
        self._chunk = chunk
        lo, hi = self.bounds[chunk]
        if self.attention == "sdpa":
            starts = list(range(lo, hi, self.query_block))
            paths = ancestor_paths(self._dfs_out, starts)
            self._plan = []
            for a, path in zip(starts, paths):
                b = min(a + self.query_block, hi)
                picks, key_K = self._picks(path + list(range(a, b)))
                self._plan.append((a, picks, key_K))
        else:
            from torch.nn.attention.flex_attention import create_block_mask

            (path,) = ancestor_paths(self._dfs_out, [lo])
            picks, key_K = self._picks(path + list(range(lo, hi)))
            self._plan = [(lo, picks, key_K)]
            out_T = self.dfs_out_T

            def mask_mod(b, h, q, kv):
                key = key_K[kv]
                return (key <= q + lo) & (q + lo < out_T[key])

            self._block_mask = create_block_mask(
                mask_mod, None, None, hi - lo, key_K.shape[0], device=out_T.device
            )
        return lo, hi

    def attend(
        self,
        layer: int,
        q_BHQD: torch.Tensor,
        k_BGQD: torch.Tensor,
        v_BGQD: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """Attention output out_BHQD (dtype of q) of the current chunk's queries at `layer`.

        q [1, H, Q, D], k and v [1, G, Q, D] (after rotary embedding), Q = the chunk's length,
        H a multiple of G. Caches k and v for later chunks. Raises `ValueError` when a layer is
        called twice for one chunk or the shapes do not match the chunk.
        """
        lo, hi = self.bounds[self._chunk]
        if q_BHQD.shape[2] != hi - lo or k_BGQD.shape[2] != hi - lo:
            raise ValueError(
                f"chunk {self._chunk} has {hi - lo} tokens, got q {tuple(q_BHQD.shape)} "
                f"and k {tuple(k_BGQD.shape)}"
            )
        k_parts = self._k.setdefault(layer, [])
        v_parts = self._v.setdefault(layer, [])
        if len(k_parts) != self._chunk:
            raise ValueError(f"layer {layer} attended twice (or skipped) at chunk {self._chunk}")
        k_parts.append(k_BGQD)
        v_parts.append(v_BGQD)
        if self.attention == "flex":
            _, picks, _ = self._plan[0]
            k, v = _gather(k_parts, picks), _gather(v_parts, picks)
            return _flex(q_BHQD, k, v, self._block_mask, scale)
        outs = []
        grad = torch.is_grad_enabled()
        for a, picks, key_K in self._plan:
            b = min(a + self.query_block, hi)
            q_blk = q_BHQD[:, :, a - lo : b - lo]
            args = (q_blk, k_parts, v_parts, picks, key_K, self.dfs_out_T, a, scale)
            if grad:
                outs.append(checkpoint(_block_attention, *args, use_reentrant=False))
            else:
                outs.append(_block_attention(*args))
        return torch.cat(outs, dim=2)
