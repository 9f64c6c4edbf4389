"""field case B11: per-token weight versions across abort and resume; staleness per token."""

from __future__ import annotations

import torch

from gyre.rl import microbatch_loss, mixed_version_calls, stale_token_mask
from gyre.trajectory import build_tree, pack_batch, select_trajectories
from tests.rl.models import tiny_qwen2
from tests.trajectory.builders import make_call

VERSIONS = [2, 2, 4, 4] + [6] * 8


def _resumed_call():
    # 2 tokens at v2 (aborted), 2 at v4 (aborted again), 8 at v6 (finish_reason=length)
    completion = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 4]
    logprobs = [-0.1 * (i + 1) for i in range(12)]
    return make_call(
        "e",
        "a",
        [1, 2, 3],
        completion,
        logprobs=logprobs,
        versions=VERSIONS,
        finish_reason="length",
    )


def test_b11_every_token_keeps_its_version_and_logprob():
    call = _resumed_call()
    tree = build_tree([call])
    assert tree.version_N[tree.policy_N].tolist() == VERSIONS
    assert tree.logprob_N[tree.policy_N].tolist() == call.logprobs
    assert len(tree.token_N) == 3 + 12  # no token lost across the aborts


def test_b11_mixing_disallowed_names_the_call():
    ok = make_call("e", "b", [1], [2, 3], versions=[6, 6])
    assert mixed_version_calls([_resumed_call(), ok]) == ["a"]


def test_b11_staleness_masks_old_tokens_per_token_not_by_newest():
    mask = stale_token_mask(torch.tensor(VERSIONS), trainer_version=7, max_staleness=2)
    assert mask.tolist() == [False] * 4 + [True] * 8
    edge = stale_token_mask(torch.tensor([-1, 8, 5]), trainer_version=7, max_staleness=2)
    assert edge.tolist() == [False, False, True]  # context, newer than trainer, fresh


def test_b11_trainer_masks_the_v2_and_v4_tokens():
    tree = build_tree([_resumed_call()])
    (batch,) = pack_batch([(tree, select_trajectories(tree, 1))], token_budget=100)
    model = tiny_qwen2(seed=2, vocab=16)
    loss, stats = microbatch_loss(model, batch, {"e": 1.0}, trainer_version=7, max_staleness=2)
    assert (stats.tokens, stats.masked_tokens) == (8, 4)
    # The kept tokens each keep their 1/12 weight: the loss has exactly their gradient.
    loss.backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
