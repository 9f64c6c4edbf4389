"""Packing: DFS layout, tree position ids, parent pointers, ancestor intervals, loss weights."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.trajectory import build_tree, pack_batch, pack_tree, select_trajectories
from tests.trajectory.builders import make_call, random_execution


def _ancestors(parent_T, q):
    out = set()
    while q >= 0:
        out.add(q)
        q = int(parent_T[q])
    return out


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), jmax=st.integers(1, 8))
def test_layout_matches_brute_force_tree_relations(seed, jmax):
    tree = build_tree(random_execution(seed))
    sel = select_trajectories(tree, jmax)
    packed = pack_tree(tree, sel, num_executions=3)
    t = packed.num_tokens
    node_T, parent_T = packed.node_T, packed.parent_T
    assert sorted(node_T.tolist()) == np.flatnonzero(sel.node_mask_N).tolist()
    assert packed.input_ids_T.tolist() == tree.token_N[node_T].tolist()
    assert packed.position_ids_T.tolist() == tree.depth_N[node_T].tolist()
    where = {int(n): i for i, n in enumerate(node_T)}
    for i in range(t):
        p = int(tree.parent_N[node_T[i]])
        assert parent_T[i] == (where[p] if p >= 0 else -1)
        assert parent_T[i] < i  # DFS preorder: parents first
    for q in range(t):  # k is an ancestor-or-self of q iff k <= q < dfs_out[k]
        anc = _ancestors(parent_T, q)
        interval = {k for k in range(t) if k <= q < packed.dfs_out_T[k]}
        assert interval == anc
    w = 1 / sel.policy_tokens / 3 if sel.policy_tokens else 0.0
    assert np.allclose(packed.loss_weight_T, np.where(tree.policy_N[node_T], w, 0.0))


def _chain_of_three(execution_id="e"):
    p1, c1 = [1, 2, 3], [10, 11]
    p2 = p1 + c1 + [50]
    c2 = [12, 13, 14]
    p3 = p2 + c2 + [51, 52]
    c3 = [15]
    return [
        make_call(execution_id, "a", p1, c1, logprobs=[-1.0, -1.1]),
        make_call(execution_id, "b", p2, c2, parent="a", logprobs=[-2.0, -2.1, -2.2]),
        make_call(execution_id, "c", p3, c3, parent="b", logprobs=[-3.0]),
    ]


def test_chain_of_three_calls_trains_each_completion_exactly_once():
    tree = build_tree(_chain_of_three())
    assert tree.statistics().branches == 1
    packed = pack_tree(tree, select_trajectories(tree, 4), num_executions=1)
    assert packed.input_ids_T.tolist() == [1, 2, 3, 10, 11, 50, 12, 13, 14, 51, 52, 15]
    assert packed.position_ids_T.tolist() == list(range(12))
    trained = packed.behaviour_logprob_T[packed.policy_T].tolist()
    assert trained == [-1.0, -1.1, -2.0, -2.1, -2.2, -3.0]
    assert np.allclose(packed.loss_weight_T[packed.policy_T], 1 / 6)
    assert packed.loss_weight_T[~packed.policy_T].tolist() == [0.0] * 6


def test_one_call_and_three_call_executions_get_equal_total_weight():
    one = build_tree([make_call("x", "a", [1, 2], [3, 4, 5, 6, 7, 8, 9, 10, 11])])
    three = build_tree(_chain_of_three("y"))
    items = [(t, select_trajectories(t, 8)) for t in (one, three)]
    (batch,) = pack_batch(items, token_budget=1000)
    assert batch.execution_ids == ("x", "y")
    per_execution = np.bincount(batch.execution_T, weights=batch.loss_weight_T)
    assert per_execution.tolist() == pytest.approx([0.5, 0.5])


def test_two_trees_in_one_micro_batch_never_see_each_other():
    a = build_tree(_chain_of_three("a"))
    b = build_tree([make_call("b", "x", [1, 2, 3], [10, 99])])
    items = [(a, select_trajectories(a, 2)), (b, select_trajectories(b, 2))]
    (batch,) = pack_batch(items, token_budget=100)
    na = a.statistics().unique_tokens
    assert batch.num_tokens == na + 5
    assert batch.dfs_out_T[:na].max() == na  # a's intervals end inside a
    assert batch.parent_T[na] == -1 and batch.position_ids_T[na] == 0


def test_token_budget_splits_micro_batches_without_splitting_trees():
    trees = [build_tree([make_call(f"e{i}", "a", [1, 2, 3], [4] * (i + 1))]) for i in range(4)]
    items = [(t, select_trajectories(t, 1)) for t in trees]  # 4, 5, 6, 7 tokens
    batches = pack_batch(items, token_budget=11)
    assert [b.execution_ids for b in batches] == [("e0", "e1"), ("e2",), ("e3",)]
    assert [b.num_tokens for b in batches] == [9, 6, 7]
    total = sum(b.loss_weight_T.sum() for b in batches)
    assert total == pytest.approx(1.0)  # four executions, a quarter each
    (big,) = pack_batch(items[3:], token_budget=2)  # a tree over the budget goes alone
    assert big.num_tokens == 7


def test_zero_policy_token_execution_packs_with_zero_weight_not_nan():
    tree = build_tree([make_call("e", "a", [1, 2, 3], [], finish_reason="abort")])
    sel = select_trajectories(tree, 2)
    packed = pack_tree(tree, sel, num_executions=1)
    assert sel.policy_tokens == 0
    assert packed.loss_weight_T.tolist() == [0.0, 0.0, 0.0]


def test_bad_arguments():
    tree = build_tree(_chain_of_three())
    other = build_tree([make_call("z", "a", [1], [2])])
    with pytest.raises(ValueError, match="num_executions=0"):
        pack_tree(tree, select_trajectories(tree, 1), num_executions=0)
    with pytest.raises(ValueError, match="'z'"):
        pack_tree(tree, select_trajectories(other, 1), num_executions=1)
    with pytest.raises(ValueError, match="token_budget=0"):
        pack_batch([(tree, select_trajectories(tree, 1))], token_budget=0)
