"""Tree attention over a packed tree forwarded in DFS chunks, each chunk reading its ancestors'
cached K/V: memory linear in tokens, no T x T mask.

Owns `TreeKVCache` (one tree's per-layer K/V, filled chunk by chunk during one forward),
`ancestor_paths` and `check_attention_backend`. The rule is `tree_attention.tree_mask`'s: key k is
visible to query q iff `k <= q < dfs_out[k]` (packed indices in DFS preorder). Because a subtree
is one interval, the keys any query of a contiguous block [a, b) can see are the strict ancestors
of a (its root path) plus [a, b).

- `sdpa` on CPU: a path (tokens between branch points) of >= `query_block` tokens is one block;
  shorter paths are grouped into blocks of `query_block` rows. A block that is one path sees
  its whole root path and itself causally:
  one unmasked flash call per contiguous run of the root path plus one causal call on the block,
  merged exactly by their log-sum-exp (`_ChunkAttention`, whose backward runs the flash backward
  of each piece against the merged output and log-sum-exp). Only a block that straddles a branch
  point takes the masked fallback: one flash call over its gathered keys under an additive mask,
  rebuilt in backward. Nothing but the chunk's q, output and log-sum-exp is saved.
- `sdpa` elsewhere: every block gathers its keys and runs SDPA under a mask, checkpointed.
- `flex` (GPU training): one FlexAttention call per chunk over [ancestors of its first token ;
  the chunk] with a `BlockMask` built from the same rule (fully masked blocks skipped).

One backward after all chunks is exact. Knows nothing about models, trees or losses; the caller
hands it `dfs_out_T` and the chunk cuts. Shape suffixes: `B` batch (1), `H` query heads, `G` K/V
heads, `Q` chunk or block queries, `K` keys of a block, `D` head dim, `T` packed tokens.
"""

from __future__ import annotations

import bisect
import os
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np
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


class _Block(NamedTuple):
    """One query block [a, b) (packed indices) of a chunk and where its keys are.

    Fast (`key_K` None): `pieces` of (part, start, end, causal), local rows of the cached parts:
    the contiguous runs of the root path (unmasked) and the block itself (causal, last). A root
    path in more than `_MAX_RUNS` runs is one piece of part -1 instead: its rows gathered by
    `picks`. Masked (a block straddling a branch point): `picks` (part, local rows) of all its
    keys, `key_K` their packed indices."""

    a: int
    b: int
    pieces: tuple[tuple[int, int, int, bool], ...]
    picks: list[tuple[int, torch.Tensor]]
    key_K: torch.Tensor | None


_MAX_RUNS = 8
"""A root path in more runs than this is gathered into one piece (fewer calls, fewer merges)."""


def _piece_keys(blk, j, s, e, k_parts, v_parts):
    """k, v of one piece of a fast block: a slice of part j, or the gathered rows (j = -1)."""
    if j < 0:
        return _gather(k_parts, blk.picks), _gather(v_parts, blk.picks)
    return k_parts[j][:, :, s:e], v_parts[j][:, :, s:e]


def _scatter_grads(picks, dk_BGKD, dv_BGKD, acc):
    """Add the gradients of gathered keys (in `picks` order) into their parts' accumulators."""
    off = 0
    for j, local in picks:
        gk, gv = acc(j)
        m = local.shape[0]
        gk.index_add_(2, local, dk_BGKD[:, :, off : off + m])
        gv.index_add_(2, local, dv_BGKD[:, :, off : off + m])
        off += m


def _flash(q, k, v, causal, scale, mask=None):
    """(out_BHQD, lse_BHQ) of CPU flash attention (GQA native; lse float32 for 16-bit q)."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, causal, attn_mask=mask, scale=scale
    )


def _masked_keys(blk, k_parts, v_parts, dfs_out_T, dtype):
    """Gathered k, v of a masked block and its additive mask [1, 1, Q, K] (0 or -inf)."""
    q_Q = torch.arange(blk.a, blk.b, device=dfs_out_T.device)
    key_K = blk.key_K
    seen_QK = (key_K[None, :] <= q_Q[:, None]) & (q_Q[:, None] < dfs_out_T[key_K][None, :])
    mask_QK = torch.zeros(seen_QK.shape, dtype=dtype, device=dfs_out_T.device)
    mask_QK.masked_fill_(~seen_QK, float("-inf"))
    return _gather(k_parts, blk.picks), _gather(v_parts, blk.picks), mask_QK[None, None]


def _block_forward(blk, q_BHQD, k_parts, v_parts, dfs_out_T, scale):
    """(out_BHQD, lse_BHQ) of one block: its pieces merged by log-sum-exp, or the masked call."""
    if blk.key_K is not None:
        k, v, mask = _masked_keys(blk, k_parts, v_parts, dfs_out_T, q_BHQD.dtype)
        return _flash(q_BHQD, k, v, False, scale, mask)
    parts = [
        _flash(q_BHQD, *_piece_keys(blk, j, s, e, k_parts, v_parts), causal, scale)
        for j, s, e, causal in blk.pieces
    ]
    if len(parts) == 1:
        return parts[0]
    lse_BHQ = torch.logsumexp(torch.stack([lse for _, lse in parts]), 0)
    out = sum(o.to(lse_BHQ.dtype) * (lse - lse_BHQ).exp_()[..., None] for o, lse in parts)
    assert isinstance(out, torch.Tensor)
    return out.to(q_BHQD.dtype), lse_BHQ


class _ChunkAttention(torch.autograd.Function):
    """Attention of one chunk's queries (CPU flash kernels), every block per its `_Block`.

    Backward runs the flash backward of each piece with the block's merged output and
    log-sum-exp: softmax over the union of the pieces' keys is what each piece's probabilities
    exp(s - lse) then are, so the pieces' gradients sum to the exact gradient."""

    @staticmethod
    def forward(ctx: Any, plan, lo, dfs_out_T, scale, q_BHQD, *kv_parts):
        n = len(kv_parts) // 2
        k_parts, v_parts = kv_parts[:n], kv_parts[n:]
        b, h, q, d = q_BHQD.shape
        out_BHQD = q_BHQD.new_empty(b, q, h, d).transpose(1, 2)  # [B, Q, H, D] in memory
        lse_dtype = torch.promote_types(q_BHQD.dtype, torch.float32)
        lse_BHQ = torch.empty(b, q, h, dtype=lse_dtype, device=q_BHQD.device).transpose(1, 2)
        for blk in plan:
            rows = slice(blk.a - lo, blk.b - lo)
            out, lse = _block_forward(blk, q_BHQD[:, :, rows], k_parts, v_parts, dfs_out_T, scale)
            out_BHQD[:, :, rows] = out
            lse_BHQ[:, :, rows] = lse
        ctx.save_for_backward(q_BHQD, out_BHQD, lse_BHQ, *kv_parts)
        ctx.plan, ctx.lo, ctx.dfs_out_T, ctx.scale = plan, lo, dfs_out_T, scale
        return out_BHQD

    @staticmethod
    def backward(ctx: Any, grad_BHQD):
        q_BHQD, out_BHQD, lse_BHQ, *kv_parts = ctx.saved_tensors
        n = len(kv_parts) // 2
        k_parts, v_parts = kv_parts[:n], kv_parts[n:]
        grad_BHQD = grad_BHQD.contiguous()
        dq_BHQD = torch.empty_like(q_BHQD)
        dk: list[torch.Tensor | None] = [None] * n
        dv: list[torch.Tensor | None] = [None] * n

        def acc(j):
            if dk[j] is None:
                dk[j], dv[j] = torch.zeros_like(k_parts[j]), torch.zeros_like(v_parts[j])
            return dk[j], dv[j]

        bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
        for blk in ctx.plan:
            rows = slice(blk.a - ctx.lo, blk.b - ctx.lo)
            go, q, out, lse = (x[:, :, rows] for x in (grad_BHQD, q_BHQD, out_BHQD, lse_BHQ))
            if blk.key_K is not None:
                k, v, mask = _masked_keys(blk, k_parts, v_parts, ctx.dfs_out_T, q.dtype)
                dq, dk_K, dv_K = bwd(
                    go, q, k, v, out, lse, 0.0, False, attn_mask=mask, scale=ctx.scale
                )
                _scatter_grads(blk.picks, dk_K, dv_K, acc)
            else:
                dq = None
                for j, s, e, causal in blk.pieces:
                    k, v = _piece_keys(blk, j, s, e, k_parts, v_parts)
                    dq_i, dk_i, dv_i = bwd(go, q, k, v, out, lse, 0.0, causal, scale=ctx.scale)
                    dq = dq_i if dq is None else dq.add_(dq_i)
                    if j < 0:
                        _scatter_grads(blk.picks, dk_i, dv_i, acc)
                    else:
                        gk, gv = acc(j)
                        gk[:, :, s:e] += dk_i
                        gv[:, :, s:e] += dv_i
            dq_BHQD[:, :, rows] = dq
        return None, None, None, None, dq_BHQD, *dk, *dv


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
        self._starts = np.asarray(chunk_starts, dtype=np.int64)
        self._chunk = -1
        self._plan: list[_Block] = []
        self._block_mask: BlockMask | None = None
        # the CPU flash kernels return the log-sum-exp that merging pieces needs
        self._merge = attention == "sdpa" and dfs_out_T.device.type == "cpu"
        self.fast_blocks = 0
        """Query blocks planned on the fast path (root path runs + causal block), all chunks."""
        self.masked_blocks = 0
        """Query blocks planned with a mask (straddling a branch point, or off CPU)."""

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

    def _runs(self, path: list[int]) -> list[tuple[int, int, int, bool]]:
        """The root path `path` (ascending packed indices) as (part, start, end, False) pieces:
        maximal runs of consecutive indices within one chunk, in local rows."""
        if not path:
            return []
        p = np.asarray(path, dtype=np.int64)
        part = np.searchsorted(self._starts, p, side="right") - 1
        cut = np.flatnonzero((np.diff(p) != 1) | (np.diff(part) != 0)) + 1
        firsts = np.concatenate(([0], cut))
        lasts = np.concatenate((cut, [p.size])) - 1
        return [
            (
                int(part[i]),
                int(p[i] - self._starts[part[i]]),
                int(p[k] + 1 - self._starts[part[i]]),
                False,
            )
            for i, k in zip(firsts.tolist(), lasts.tolist())
        ]

    def _blocks(self, lo: int, hi: int, ends: list[int]) -> list[tuple[int, int]]:
        """Query blocks [a, b) of the chunk [lo, hi), whose paths (runs) end at `ends`.

        With the fast kernels, a run of at least `query_block` tokens is one block, however long
        (its cost grows like a causal sequence's); the runs between are grouped into blocks of up
        to `query_block` rows. Otherwise blocks of `query_block` rows."""
        qb = self.query_block
        if not self._merge:
            return [(a, min(a + qb, hi)) for a in range(lo, hi, qb)]
        blocks = []
        a = lo
        while a < hi:
            e = ends[bisect.bisect_right(ends, a)]
            if e - a >= qb:
                blocks.append((a, e))
                a = e
                continue
            b = e
            while b < min(a + qb, hi):
                e = ends[bisect.bisect_right(ends, b)]
                if e - b >= qb:
                    break  # a long run starts at b: its own block
                b = min(e, a + qb)
            blocks.append((a, b))
            a = b
        return blocks

    def begin_chunk(self, chunk: int) -> tuple[int, int]:
        """Make `chunk` (the next one in order) current; returns its [lo, hi)."""
        if chunk != self._chunk + 1:
            raise ValueError(f"chunks run in order: expected {self._chunk + 1}, got {chunk}")
        self._chunk = chunk
        lo, hi = self.bounds[chunk]
        if self.attention == "sdpa":
            # token k + 1 is k's child iff it lies in k's subtree: a path (run) ends after k
            # iff dfs_out[k] <= k + 1
            out = self._dfs_out
            ends = [k + 1 for k in range(lo, hi - 1) if out[k] <= k + 1] + [hi]
            cuts = self._blocks(lo, hi, ends)
            paths = ancestor_paths(self._dfs_out, [a for a, _ in cuts])
            self._plan = []
            for (a, b), path in zip(cuts, paths):
                if self._merge and ends[bisect.bisect_right(ends, a)] >= b:
                    runs = self._runs(path)
                    picks: list[tuple[int, torch.Tensor]] = []
                    if len(runs) > _MAX_RUNS:
                        picks, _ = self._picks(path)
                        runs = [(-1, 0, len(path), False)]
                    pieces = (*runs, (chunk, a - lo, b - lo, True))
                    self._plan.append(_Block(a, b, pieces, picks, None))
                    self.fast_blocks += 1
                else:
                    picks, key_K = self._picks(path + list(range(a, b)))
                    self._plan.append(_Block(a, b, (), picks, key_K))
                    self.masked_blocks += 1
        else:
            from torch.nn.attention.flex_attention import create_block_mask

            (path,) = ancestor_paths(self._dfs_out, [lo])
            picks, key_K = self._picks(path + list(range(lo, hi)))
            self._plan = [_Block(lo, hi, (), picks, key_K)]
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
            picks = self._plan[0].picks
            k, v = _gather(k_parts, picks), _gather(v_parts, picks)
            return _flex(q_BHQD, k, v, self._block_mask, scale)
        if self._merge:
            out = _ChunkAttention.apply(
                self._plan, lo, self.dfs_out_T, scale, q_BHQD, *k_parts, *v_parts
            )
            assert isinstance(out, torch.Tensor)
            return out
        outs = []
        grad = torch.is_grad_enabled()
        for a, b, _, picks, key_K in self._plan:
            q_blk = q_BHQD[:, :, a - lo : b - lo]
            args = (q_blk, k_parts, v_parts, picks, key_K, self.dfs_out_T, a, scale)
            if grad:
                outs.append(checkpoint(_block_attention, *args, use_reentrant=False))
            else:
                outs.append(_block_attention(*args))
        return torch.cat(outs, dim=2)
