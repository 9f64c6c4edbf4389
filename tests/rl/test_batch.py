"""build_training_batch: admission rules, group baselines and per-execution weights in one place."""

from __future__ import annotations

import numpy as np
import pytest

from gyre.rl import ExecutionSample, build_training_batch
from tests.trajectory.builders import make_call


def _sample(eid, group, reward, completion, *, versions=None, calls=True):
    call = make_call(eid, "a", [1, 2, 3], completion, versions=versions,
                     finish_reason="stop" if completion else "abort")
    return ExecutionSample(execution_id=eid, group_id=group, reward=reward, calls=[call] if calls else [])


def test_field_example_group_and_exclusions():
    samples = [
        _sample("f1", "t", 1.0, [4, 5]),
        _sample("f2", "t", 1.0, [4, 6, 7]),
        _sample("timeout", "t", 0.25, [8]),
        _sample("f0", "t", 0.0, [9, 9]),
        _sample("failed", "t", None, [4]),
        _sample("empty", "t", 0.0, []),  # aborted before its first token (B20)
        _sample("nocalls", "t", 0.0, [], calls=False),
        _sample("mixed", "u", 1.0, [4, 5], versions=[1, 2]),
    ]
    out = build_training_batch(samples, jmax=4, token_budget=1000, allow_version_mixing=False)
    assert out.baselines == {"t": 0.5625, "u": None}
    assert [out.advantages[e] for e in ("f1", "f2", "timeout", "f0")] == [0.4375, 0.4375, -0.3125, -0.5625]
    assert out.excluded == {
        "failed": "failed",
        "empty": "no policy tokens in the selected trajectories",
        "nocalls": "no model calls",
        "mixed": "calls ['a'] mix weight versions",
    }
    assert all(out.advantages[e] is None for e in out.excluded)
    assert out.trained_executions == 4
    (batch,) = out.micro_batches
    assert batch.execution_ids == ("f1", "f2", "timeout", "f0")
    assert np.bincount(batch.execution_T, weights=batch.loss_weight_T).tolist() == pytest.approx([0.25] * 4)


def test_mixing_allowed_keeps_the_execution():
    out = build_training_batch([_sample("mixed", "u", 1.0, [4, 5], versions=[1, 2])], jmax=1,
                               token_budget=100)
    assert out.excluded == {} and out.advantages == {"mixed": 0.0}


def test_nothing_trainable_gives_no_micro_batches():
    out = build_training_batch([_sample("x", "t", None, [4])], jmax=1, token_budget=100)
    assert out.micro_batches == [] and out.trained_executions == 0


def test_duplicate_ids_raise():
    with pytest.raises(ValueError, match="duplicate"):
        build_training_batch([_sample("x", "t", 1.0, [4]), _sample("x", "t", 1.0, [5])], jmax=1,
                             token_budget=100)
