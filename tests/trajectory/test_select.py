"""Jmax selection: role priority, most policy tokens first, deterministic, shared tokens once."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.tito.records import ROLES
from gyre.trajectory import build_tree, select_trajectories
from gyre.trajectory.select import ancestor_mask
from tests.trajectory.builders import make_call, random_execution


def _jmax_execution():
    """Main: one chain with 3 leaves; sub-agents: 4 own contexts with 6, 2, 5, 3 policy tokens."""
    sys_main = [1, 2, 3]
    calls = [
        make_call("e", "m0", sys_main, [10, 11]),  # 2 policy tokens, shared by all main paths
        make_call("e", "m1", sys_main + [10, 11, 40], [12], parent="m0", role="main"),
        make_call("e", "m2", sys_main + [10, 11, 41], [13, 14], parent="m0", role="main"),
        make_call("e", "m3", sys_main + [10, 11, 42], [15, 16, 17], parent="m0", role="main"),
    ]
    for k, n in enumerate([6, 2, 5, 3]):
        completion = list(range(100, 100 + n))
        calls.append(make_call("e", f"s{k}", [5, 6, 60 + k], completion, role="sub_agent"))
    return calls


def test_jmax5_keeps_three_main_and_two_largest_sub_agents():
    tree = build_tree(_jmax_execution())
    assert tree.statistics().branches == 7
    sel = select_trajectories(tree, 5)
    assert sel.roles == ("main", "main", "main", "sub_agent", "sub_agent")
    ends = {c: int(tree.end_node_R[i]) for i, c in enumerate(tree.call_ids)}
    assert sel.leaves.tolist() == [ends["m3"], ends["m2"], ends["m1"], ends["s0"], ends["s2"]]
    # Shared tokens once: main 2 (m0) + 1 + 2 + 3, sub-agents 6 + 5.
    assert sel.policy_tokens == 2 + 1 + 2 + 3 + 6 + 5
    # The mask covers exactly the five paths: shared system prompt once, nothing of s1 or s3.
    want = set()
    for leaf in sel.leaves:
        want |= set(tree.path(int(leaf)).tolist())
    assert set(np.flatnonzero(sel.node_mask_N).tolist()) == want


def test_role_limits_and_priority_order():
    tree = build_tree(_jmax_execution())
    sel = select_trajectories(tree, 5, role_limits={"main": 1})
    assert sel.roles == ("main", "sub_agent", "sub_agent", "sub_agent", "sub_agent")
    sel = select_trajectories(tree, 2, role_limits={"main": 0})
    assert sel.roles == ("sub_agent", "sub_agent") and sel.policy_tokens == 11


def test_ties_break_by_leaf_id_deterministically():
    calls = [make_call("e", f"s{k}", [7, k], [1, 2], role="sub_agent") for k in range(4)]
    tree = build_tree(calls)
    first = select_trajectories(tree, 2).leaves.tolist()
    assert first == select_trajectories(tree, 2).leaves.tolist()
    assert first == [int(tree.end_node_R[0]), int(tree.end_node_R[1])]


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), jmax=st.integers(1, 8))
def test_selection_is_the_ranked_prefix_and_mask_is_the_union_of_paths(seed, jmax):
    tree = build_tree(random_execution(seed))
    sel = select_trajectories(tree, jmax)
    leaves = tree.leaves().tolist()
    ranked = sorted(leaves, key=lambda n: (int(tree.role_N[n]), -int(tree.path_policy_N[n]), n))
    assert sel.leaves.tolist() == ranked[:jmax]
    assert [ROLES.index(r) for r in sel.roles] == [int(tree.role_N[n]) for n in ranked[:jmax]]
    union = set()
    for leaf in sel.leaves:
        union |= set(tree.path(int(leaf)).tolist())
    assert set(np.flatnonzero(sel.node_mask_N).tolist()) == union
    assert sel.policy_tokens == sum(bool(tree.policy_N[n]) for n in union)
    assert np.array_equal(ancestor_mask(tree, sel.leaves), sel.node_mask_N)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"jmax": 0}, "jmax=0"),
        ({"jmax": 2, "role_limits": {"boss": 1}}, "'boss'"),
        ({"jmax": 2, "role_limits": {"main": -1}}, "-1"),
    ],
)
def test_bad_arguments(kwargs, match):
    tree = build_tree(_jmax_execution())
    with pytest.raises(ValueError, match=match):
        select_trajectories(tree, **kwargs)
