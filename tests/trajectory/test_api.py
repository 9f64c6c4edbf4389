"""The public API of gyre.trajectory, gyre.kernels and gyre.rl is exactly what `__all__` says."""

from __future__ import annotations

import importlib

import pytest

EXPECTED = {
    "gyre.trajectory": {
        "TrajectoryTree",
        "TreeStatistics",
        "build_tree",
        "Selection",
        "select_trajectories",
        "PackedBatch",
        "pack_tree",
        "pack_batch",
    },
    "gyre.kernels": {
        "tree_mask",
        "tree_block_mask",
        "model_attention_mask",
        "tree_attention",
        "selective_logprob_entropy",
        "selective_logprob_entropy_reference",
        "TreeKVCache",
        "ancestor_paths",
        "check_attention_backend",
        "check_logprob_backend",
    },
    "gyre.rl": {
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
    },
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_all_lists_the_public_names_and_each_resolves(name):
    module = importlib.import_module(name)
    assert set(module.__all__) == EXPECTED[name]
    assert len(module.__all__) == len(set(module.__all__))
    public = {
        n
        for n, v in vars(module).items()
        if not n.startswith("_") and not isinstance(v, type(module))
    }
    assert public - {"annotations"} == EXPECTED[name]
