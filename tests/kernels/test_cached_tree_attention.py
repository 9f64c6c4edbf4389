"""Chunked tree attention over cached K/V (`TreeKVCache`) against the explicit softmax reference.

Random forests in DFS order (long paths and branch points), random chunk cuts, query blocks and
GQA head ratios: the output and the gradients of q, k and v equal `tree_attention`'s reference
(dense mask, explicit softmax) in float64 and float32, on the fast path (root path runs unmasked
+ the block causally, merged by log-sum-exp) and on the masked fallback; both are exercised.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.kernels import TreeKVCache, tree_attention

PLANNED = {"fast": 0, "masked": 0}


def _random_dfs_out(rng: np.random.Generator, t: int, p_branch: float) -> list[int]:
    """dfs_out of a random forest of `t` tokens in DFS preorder: token i is the child of token
    i - 1, or (with probability `p_branch`) of a random ancestor of it, or a new root."""
    out = [t] * t
    stack: list[int] = []
    for i in range(t):
        if stack and rng.random() < p_branch:
            keep = int(rng.integers(0, len(stack)))  # 0: a new root
            for k in stack[keep:]:
                out[k] = i
            del stack[keep:]
        stack.append(i)
    return out


def _chunked(q, k, v, dfs_out_T, starts, query_block, layers=2):
    """Outputs of `layers` attention layers run chunk by chunk (layer l sees q, k, v * (l + 1))."""
    cache = TreeKVCache(dfs_out_T, starts, query_block=query_block)
    outs: list[list[torch.Tensor]] = [[] for _ in range(layers)]
    scale = q.shape[-1] ** -0.5
    for c in range(len(starts)):
        lo, hi = cache.begin_chunk(c)
        for layer in range(layers):
            f = layer + 1
            x = [t[:, :, lo:hi] * f for t in (q, k, v)]
            outs[layer].append(cache.attend(layer, *x, scale))
    PLANNED["fast"] += cache.fast_blocks
    PLANNED["masked"] += cache.masked_blocks
    return [torch.cat(o, dim=2) for o in outs]


def _reference(q, k, v, dfs_out_T, layers=2):
    r = q.shape[1] // k.shape[1]
    return [
        tree_attention(
            q * (f + 1),
            (k * (f + 1)).repeat_interleave(r, 1),
            (v * (f + 1)).repeat_interleave(r, 1),
            dfs_out_T,
            impl="reference",
        )
        for f in range(layers)
    ]


def _check(seed, t, p_branch, cuts, query_block, heads, dtype, tol):
    """Chunked attention in `dtype` against the float64 reference: outputs and gradients within
    `tol` of the largest value of each."""
    rng = np.random.default_rng(seed)
    if isinstance(t, list):  # a given tree
        dfs_out_T, t = torch.tensor(t), len(t)
    else:
        dfs_out_T = torch.tensor(_random_dfs_out(rng, t, p_branch))
    if isinstance(cuts, list):
        starts = cuts
    else:
        starts = sorted({0, *(rng.integers(1, t, cuts).tolist() if t > 1 else [])})
    g, r = heads
    gen = torch.Generator().manual_seed(seed)
    q64 = torch.randn(1, g * r, t, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    k64, v64 = (
        torch.randn(1, g, t, 8, generator=gen, dtype=torch.float64, requires_grad=True)
        for _ in "kv"
    )
    q, k, v = (x.detach().to(dtype).requires_grad_() for x in (q64, k64, v64))
    outs = _chunked(q, k, v, dfs_out_T, starts, query_block)
    refs = _reference(q64, k64, v64, dfs_out_T)
    weights = [torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in refs]
    loss = sum((o * w.to(dtype)).sum() for o, w in zip(outs, weights))
    loss_ref = sum((o * w).sum() for o, w in zip(refs, weights))
    grads = torch.autograd.grad(loss, (q, k, v))
    grads_ref = torch.autograd.grad(loss_ref, (q64, k64, v64))
    for name, a, b in zip(["out0", "out1", "q", "k", "v"], [*outs, *grads], [*refs, *grads_ref]):
        err = (a.double() - b).abs().max().item()
        assert err <= tol * max(1.0, b.abs().max().item()), (name, err)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    t=st.integers(1, 70),
    p_branch=st.sampled_from([0.0, 0.02, 0.1, 0.5]),
    cuts=st.sampled_from([0, 1, 2, 4, 30]),
    query_block=st.integers(1, 24),
    heads=st.sampled_from([(1, 1), (2, 1), (2, 2), (1, 3)]),
)
def test_chunked_tree_attention_equals_reference_float64(
    seed, t, p_branch, cuts, query_block, heads
):
    _check(seed, t, p_branch, cuts, query_block, heads, torch.float64, 1e-10)


def test_both_block_paths_are_exercised():
    # fixed cases that take each path: a long path (fast blocks, root path over chunks) and a
    # bushy tree (blocks straddling branch points, masked)
    PLANNED.update(fast=0, masked=0)
    _check(0, 64, 0.0, 3, 8, (2, 2), torch.float64, 1e-10)
    assert PLANNED["fast"] >= 4 and PLANNED["masked"] == 0
    _check(1, 64, 0.5, 3, 8, (2, 2), torch.float64, 1e-10)
    assert PLANNED["masked"] > 0
    PLANNED.update(fast=0, masked=0)
    for seed in range(6):
        _check(seed, 50, 0.1, 2, 5, (2, 1), torch.float64, 1e-10)
    assert PLANNED["fast"] > 0 and PLANNED["masked"] > 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chunked_tree_attention_float32(seed):
    # float32 against the float64 reference: within float32 rounding (a float32 reference is
    # off by 1e-6 of the largest gradient here, the chunked kernels by 2e-6)
    _check(seed, 300, 0.01, 3, 64, (2, 2), torch.float32, 1e-5)


def test_a_long_path_plans_runs_of_its_root_path():
    # one path of 10 tokens cut into chunks [0, 4) [4, 10): each chunk is one run of at least
    # query_block tokens, so one block; [4, 10) sees rows 0..3 of chunk 0 unmasked, then itself
    # causally
    dfs_out_T = torch.full((10,), 10)
    cache = TreeKVCache(dfs_out_T, [0, 4], query_block=3)
    cache.begin_chunk(0)
    assert [(blk.a, blk.b, blk.pieces) for blk in cache._plan] == [(0, 4, ((0, 0, 4, True),))]
    cache.begin_chunk(1)
    assert [(blk.a, blk.b, blk.pieces) for blk in cache._plan] == [
        (4, 10, ((0, 0, 4, False), (1, 0, 6, True)))
    ]
    assert cache.fast_blocks == 2 and cache.masked_blocks == 0


def test_short_runs_are_grouped_and_long_runs_are_one_block():
    # runs (paths between branch points) [0, 2) [2, 3) [3, 9) [9, 10) [10, 12), query_block 4:
    # [0, 3) two short runs grouped (straddles a branch point: masked), [3, 9) one long run,
    # [9, 12) two short runs grouped (masked)
    dfs_out = [12, 2, 3, 9, 9, 9, 9, 9, 9, 10, 12, 12]  # 0 -> {1, 2, 3 -> ... -> 8, 9, 10 -> 11}
    cache = TreeKVCache(torch.tensor(dfs_out), [0], query_block=4)
    cache.begin_chunk(0)
    assert [(blk.a, blk.b, blk.key_K is None) for blk in cache._plan] == [
        (0, 3, False),
        (3, 9, True),
        (9, 12, False),
    ]
    assert cache._plan[1].pieces == ((0, 0, 1, False), (0, 3, 9, True))
    _check(3, dfs_out, 0.0, [0], 4, (2, 2), torch.float64, 1e-10)


def test_a_root_path_in_many_runs_is_gathered_into_one_piece():
    # one path of 20 tokens in chunks of 2: the root path of block [18, 20) is 9 runs (one per
    # earlier chunk), more than _MAX_RUNS, so it is one gathered piece (part -1)
    starts = list(range(0, 20, 2))
    cache = TreeKVCache(torch.full((20,), 20), starts, query_block=2)
    for c in range(len(starts)):
        cache.begin_chunk(c)
    (blk,) = cache._plan
    assert blk.pieces == ((-1, 0, 18, False), (9, 0, 2, True))
    assert [(j, local.tolist()) for j, local in blk.picks] == [(j, [0, 1]) for j in range(9)]
    _check(2, 20, 0.0, starts, 2, (2, 2), torch.float64, 1e-10)
    _check(2, 20, 0.0, starts, 2, (2, 2), torch.float32, 1e-5)
