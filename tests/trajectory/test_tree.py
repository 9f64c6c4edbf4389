"""Tree building: prefix merging against a naive trie, shared completions, divergence, B02."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.trajectory import build_tree, pack_tree, select_trajectories
from tests.trajectory.builders import make_call, naive_nodes, random_execution


def _prefix_of(tree, node):
    return tuple(tree.token_N[tree.path(node)].tolist())


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_tree_equals_naive_trie(seed):
    calls = random_execution(seed)
    tree = build_tree(calls)
    ref = naive_nodes(calls)
    assert len(tree) == len(ref)
    seen = set()
    for node in range(len(tree)):
        key = _prefix_of(tree, node)
        seen.add(key)
        want = ref[key]
        assert tree.depth_N[node] == len(key) - 1
        assert bool(tree.policy_N[node]) == want["policy"]
        assert tree.call_N[node] == want["call"]
        if want["policy"]:
            assert tree.logprob_N[node] == want["logprob"]
            assert tree.version_N[node] == want["version"]
        else:
            assert math.isnan(tree.logprob_N[node]) and tree.version_N[node] == -1
        parent = tree.parent_N[node]
        assert (parent < 0) == (len(key) == 1)
        assert parent < node
    assert seen == set(ref)
    stats = tree.statistics()
    assert stats.unique_tokens == len(ref)
    assert stats.tokens_in_calls == sum(len(c.prompt_ids) + len(c.completion_ids) for c in calls)
    assert stats.policy_tokens == sum(v["policy"] for v in ref.values())
    maximal = [k for k in ref if not any(len(o) == len(k) + 1 and o[:-1] == k for o in ref)]
    assert stats.branches == len(maximal)
    assert stats.depth == max(len(k) for k in ref)
    # Every call's sequence ends at its recorded end node.
    for r, call in enumerate(calls):
        end = int(tree.end_node_R[r])
        assert _prefix_of(tree, end) == tuple(call.prompt_ids + call.completion_ids)


def test_later_prompt_shares_completion_nodes_and_keeps_their_logprobs():
    c1 = make_call("e", "a", [1, 2, 3], [4, 5], logprobs=[-0.25, -0.75], versions=[7, 7])
    c2 = make_call("e", "b", [1, 2, 3, 4, 5, 6], [7], parent="a", logprobs=[-1.5], versions=[8])
    tree = build_tree([c1, c2])
    assert tree.token_N.tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert tree.parent_N.tolist() == [-1, 0, 1, 2, 3, 4, 5]
    assert tree.policy_N.tolist() == [False, False, False, True, True, False, True]
    assert tree.logprob_N[[3, 4, 6]].tolist() == [-0.25, -0.75, -1.5]
    assert tree.version_N.tolist() == [-1, -1, -1, 7, 7, -1, 8]
    assert tree.call_N.tolist() == [0, 0, 0, 0, 0, 1, 1]
    assert tree.divergence_index("b") is None
    stats = tree.statistics()
    got = (
        stats.unique_tokens,
        stats.tokens_in_calls,
        stats.policy_tokens,
        stats.branches,
        stats.depth,
    )
    assert got == (7, 12, 3, 1, 7)


def test_n_choices_share_one_prompt_node_per_token():
    # B22 part 4: one prompt, 4 choices -> one shared prompt path with 4 child branches.
    prompt = [9, 8, 7, 6]
    calls = [make_call("e", f"a/{i}", prompt, [i + 20, 30]) for i in range(4)]
    tree = build_tree(calls)
    stats = tree.statistics()
    assert stats.unique_tokens == 4 + 4 * 2
    assert stats.branches == 4 and stats.branch_points == 1
    assert np.bincount(tree.parent_N[tree.parent_N >= 0])[3] == 4


def test_b02_template_drops_reasoning_branches_at_think_and_trains_c1_once():
    system, user = [1, 2], [3, 4, 5]
    think = [10, 11, 12]  # <think> need tool </think>
    tool_call, eot = [20, 21, 22], [30]
    tool_result = [40, 41]
    p1 = system + user
    c1 = think + tool_call + eot
    lp1 = [-0.1, -0.2, -0.3, -0.4, -0.5, -0.6, -0.7]
    p2 = system + user + tool_call + eot + tool_result  # the template dropped the <think> block
    c2 = [50, 51, 30]
    calls = [
        make_call("e", "call1", p1, c1, logprobs=lp1),
        make_call("e", "call2", p2, c2, parent="call1", logprobs=[-1.0, -1.1, -1.2]),
    ]
    tree = build_tree(calls)  # 5. no crash on the non-prefix case
    # 1. the divergence is at the first token where the <think> block was in c_1
    assert tree.divergence_index("call2") == len(p1) == 5
    # 2. two branches sharing only the common prefix
    assert tree.statistics().branches == 2
    leaves = tree.leaves()
    paths = [tree.path(int(leaf)) for leaf in leaves]
    shared = set(paths[0].tolist()) & set(paths[1].tolist())
    assert sorted(shared) == [0, 1, 2, 3, 4]
    selection = select_trajectories(tree, 5)
    packed = pack_tree(tree, selection, num_executions=1)
    trained = packed.policy_T
    # 3. c_1's tokens (think included) are trained once with lp_1; none of c_1 again inside p_2
    trained_c1 = packed.behaviour_logprob_T[trained & (packed.execution_T == 0)]
    assert sorted(trained_c1.tolist()) == sorted(lp1 + [-1.0, -1.1, -1.2])
    branch2 = tree.path(int(tree.end_node_R[1]))
    assert tree.policy_N[branch2].tolist() == [False] * len(p2) + [True] * len(c2)
    # 4. one execution; its policy-token count is len(c_1) + len(c_2)
    assert selection.policy_tokens == len(c1) + len(c2) == 10
    assert np.allclose(packed.loss_weight_T[trained], 1 / 10)
    assert packed.loss_weight_T.sum() == pytest.approx(1.0)


def test_completion_landing_on_context_becomes_policy():
    a = make_call("e", "a", [1, 2, 3, 4], [5])
    b = make_call("e", "b", [1, 2], [3, 4], logprobs=[-0.3, -0.4], versions=[2, 2])
    tree = build_tree([a, b])
    assert len(tree) == 5
    assert tree.policy_N.tolist() == [False, False, True, True, True]
    assert tree.logprob_N[[2, 3]].tolist() == [-0.3, -0.4]


@pytest.mark.parametrize(
    ("calls", "match"),
    [
        ([], "at least one"),
        ([make_call("e", "a", [], [1])], "prompt_ids is empty"),
        ([make_call("e", "a", [1], [2]), make_call("f", "b", [1], [2])], "execution_id='f'"),
        ([make_call("e", "a", [1], [2]), make_call("e", "a", [1], [3])], "duplicate call_id='a'"),
        ([make_call("e", "a", [1], [2], parent="z")], "parent_call_id='z'"),
        ([make_call("e", "a", [1], [2, 3], logprobs=[-1.0])], "len\\(logprobs\\)=1"),
    ],
)
def test_bad_records_raise_value_error_naming_the_value(calls, match):
    with pytest.raises(ValueError, match=match):
        build_tree(calls)
