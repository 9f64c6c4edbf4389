"""Tree attention: SDPA and FlexAttention (forward, CPU) against an explicit softmax reference."""

from __future__ import annotations

import pytest
import torch

from gyre.kernels import model_attention_mask, tree_attention, tree_mask
from gyre.trajectory import build_tree, pack_tree, select_trajectories
from tests.trajectory.builders import random_execution


def _dfs_out(seed):
    tree = build_tree(random_execution(seed, max_calls=8))
    packed = pack_tree(tree, select_trajectories(tree, 8), num_executions=1)
    return torch.as_tensor(packed.dfs_out_T), torch.as_tensor(packed.parent_T)


def test_mask_of_a_hand_tree():
    # root 0 -> 1 -> {2, 3}; DFS: 0 1 2 3 with dfs_out [4, 4, 3, 4]
    mask = tree_mask(torch.tensor([4, 4, 3, 4]))
    assert mask.int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 0, 1]]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_sdpa_equals_reference_forward_and_backward(seed):
    dfs_out_T, _ = _dfs_out(seed)
    t = dfs_out_T.shape[0]
    g = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(1, 2, t, 16, generator=g, dtype=torch.float64, requires_grad=True)
        for _ in range(3)
    )
    out = tree_attention(q, k, v, dfs_out_T, impl="sdpa")
    ref = tree_attention(q, k, v, dfs_out_T, impl="reference")
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    grads_ref = torch.autograd.grad(ref.square().sum(), (q, k, v))
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_forward_equals_reference_on_cpu():
    dfs_out_T, _ = _dfs_out(5)
    t = dfs_out_T.shape[0]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, t, 16, generator=g) for _ in range(3))
    out = tree_attention(q, k, v, dfs_out_T, impl="flex")
    ref = tree_attention(q, k, v, dfs_out_T, impl="reference")
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_model_attention_mask_refuses_eager_and_unknown():
    dfs_out_T = torch.tensor([2, 2])
    assert model_attention_mask(dfs_out_T, "sdpa").shape == (1, 1, 2, 2)
    with pytest.raises(ValueError, match="'eager'"):
        model_attention_mask(dfs_out_T, "eager")
    with pytest.raises(ValueError, match="impl='dense'"):
        x = torch.zeros(1, 1, 2, 4)
        tree_attention(x, x, x, dfs_out_T, impl="dense")


def test_bad_intervals_raise():
    with pytest.raises(ValueError, match="dfs_out_T"):
        tree_mask(torch.tensor([1, 1]))  # dfs_out[1] must exceed 1
    with pytest.raises(ValueError, match="dfs_out_T"):
        tree_mask(torch.tensor([3, 2]))  # beyond T
