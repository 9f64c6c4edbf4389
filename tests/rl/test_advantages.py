"""Group-baseline advantages and field case B20 (empty and lone-EOS completions)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gyre.config import RLConfig
from gyre.rl import group_advantages, microbatch_loss, reward_of
from gyre.tasks.outcome import Outcome, Score
from gyre.trajectory import build_tree, pack_batch, select_trajectories
from tests.rl.models import tiny_qwen2
from tests.trajectory.builders import make_call


def test_group_baseline_excludes_failed_and_keeps_partial_scores():
    # finished 1.0, 1.0; timed out with partial 0.25; finished 0.0; failed
    adv = group_advantages(["a", "b", "c", "d", "e"], [1.0, 1.0, 0.25, 0.0, None])
    assert adv.baseline == 0.5625
    assert adv.advantages == (0.4375, 0.4375, -0.3125, -0.5625, None)
    assert adv.as_dict()["e"] is None


def _outcome(termination: str, score: float | None) -> Outcome:
    if score is None:
        return Outcome(execution_id="e", task_id="s/t", termination="failed", failure_reason="x")
    passed = round(score * 4)
    result = Score(passed=passed, total=4, score=score, all_passed=passed == 4)
    return Outcome(execution_id="e", task_id="s/t", termination=termination, score=result)


def test_reward_of_reads_task_outcomes():
    assert reward_of(_outcome("timeout", 0.25)) == 0.25
    assert reward_of(_outcome("finished", 1.0)) == 1.0
    assert reward_of(_outcome("failed", None)) is None


@pytest.mark.parametrize(
    "termination", ["timeout", "turn_limit", "token_budget", "context_exceeded"]
)
def test_stop_penalty_is_taken_off_stopped_executions_only(termination):
    assert reward_of(_outcome(termination, 1.0), stop_penalty=0.5) == 0.5
    assert reward_of(_outcome(termination, 0.25), stop_penalty=0.5) == -0.25
    assert reward_of(_outcome("finished", 0.75), stop_penalty=0.5) == 0.75
    assert reward_of(_outcome("failed", None), stop_penalty=0.5) is None
    # the group of the collapsed warm-up run (seed 4, steps 3-4): the turn-limit execution with
    # every file right had advantage +0.5; with the penalty it ties the finished 0.5
    group = (("turn_limit", 1.0), ("finished", 0.5), ("finished", 0.25), ("finished", 0.25))
    for penalty, expected in (
        (0.0, (0.5, 0.0, -0.25, -0.25)),
        (0.5, (0.125, 0.125, -0.125, -0.125)),
    ):
        rewards = [reward_of(_outcome(t, s), stop_penalty=penalty) for t, s in group]
        assert group_advantages(["a", "b", "c", "d"], rewards).advantages == expected


@pytest.mark.parametrize("penalty", [-0.1, 1.5, float("nan")])
def test_stop_penalty_outside_0_1_is_refused(penalty):
    with pytest.raises(ValueError, match="stop_penalty=.* must be in \\[0, 1\\]"):
        reward_of(_outcome("finished", 1.0), stop_penalty=penalty)
    with pytest.raises(ValueError, match="stop_penalty=.* must be in \\[0, 1\\]"):
        RLConfig(stop_penalty=penalty)


def test_all_failed_group_has_no_baseline():
    adv = group_advantages(["a", "b"], [None, None])
    assert adv.baseline is None and adv.advantages == (None, None)


@pytest.mark.parametrize(
    ("ids", "rewards", "match"),
    [
        ([], [], "at least one"),
        (["a"], [1.0, 2.0], "1 execution ids"),
        (["a", "a"], [1.0, 2.0], "duplicate"),
        (["a"], [float("nan")], "reward=nan"),
    ],
)
def test_bad_groups(ids, rewards, match):
    with pytest.raises(ValueError, match=match):
        group_advantages(ids, rewards)


def test_b20_empty_and_lone_eos_completions_build_and_train():
    eos = 3
    prompt = [1, 5, 6, 7]
    trees = {
        "e12": build_tree([make_call("e12", "a", prompt, [8] * 11 + [eos])]),
        "e9": build_tree([make_call("e9", "a", prompt, [9] * 8 + [eos])]),
        "eos": build_tree([make_call("eos", "a", prompt, [eos], logprobs=[-0.7])]),
        "empty": build_tree([make_call("empty", "a", prompt, [], finish_reason="abort")]),
    }
    rewards = {"e12": 1.0, "e9": 1.0, "eos": 0.0, "empty": 0.0}
    # 4. an execution with no policy token is marked failed: out of the baseline and the loss
    ids = list(trees)
    trainable = [r if trees[e].statistics().policy_tokens else None for e, r in rewards.items()]
    adv = group_advantages(ids, trainable)
    assert adv.as_dict()["empty"] is None
    assert adv.baseline == pytest.approx(2 / 3)
    # 2. the lone-EOS execution adds exactly 1 policy token with a negative advantage
    assert trees["eos"].statistics().policy_tokens == 1
    assert adv.as_dict()["eos"] == pytest.approx(-2 / 3)
    # 1. the batch builds; 3. the 0-token call adds 0 tokens and no NaN
    keep = [e for e in ids if adv.as_dict()[e] is not None]
    items = [(trees[e], select_trajectories(trees[e], 4)) for e in keep]
    (batch,) = pack_batch(items, token_budget=1000)
    assert np.isfinite(batch.loss_weight_T).all()
    per_execution = np.bincount(batch.execution_T, weights=batch.loss_weight_T)
    assert per_execution.tolist() == pytest.approx([1 / 3] * 3)
    eos_tokens = batch.policy_T & (batch.execution_T == keep.index("eos"))
    assert eos_tokens.sum() == 1 and batch.loss_weight_T[eos_tokens][0] == pytest.approx(1 / 3)
    empty_sel = select_trajectories(trees["empty"], 4)
    assert empty_sel.policy_tokens == 0
    model = tiny_qwen2(seed=1, vocab=16, dtype=torch.float32)
    loss, stats = microbatch_loss(model, batch, adv.as_dict(), trainer_version=1, max_staleness=0)
    assert math.isfinite(loss.item()) and stats.tokens == 12 + 9 + 1
