"""`build_training_batch` and `group_batch`: a group's advantages under `rl.stop_penalty`."""

from __future__ import annotations

import msgspec
import pytest

from gyre.config import RLConfig, RunConfig, TrajectoryConfig
from gyre.rollout.source import Executed
from gyre.runtime.batch import build_training_batch, group_batch
from gyre.tasks.outcome import Outcome, Score
from gyre.tito.records import ExecutionSummary, ModelCall


def _executed(execution_id: str, termination: str, passed: int) -> Executed:
    call = ModelCall(
        execution_id=execution_id,
        call_id="c0",
        role="main",
        prompt_tail=[5, 6, 7],
        completion_ids=[8, 9],
        logprobs=[-0.5, -0.25],
        versions=[0, 0],
        finish_reason="stop",
    )
    score = Score(passed=passed, total=4, score=passed / 4, all_passed=passed == 4)
    summary = ExecutionSummary(
        execution_id=execution_id,
        num_calls=1,
        truncated=False,
        length_calls=0,
        context_refusals=0,
        divergences=0,
        prompt_tokens=3,
        completion_tokens=2,
    )
    outcome = Outcome(
        execution_id=execution_id, task_id="s/t", termination=termination, score=score
    )
    return Executed(outcome=outcome, calls=[call], summary=summary)


def _group() -> list[Executed]:
    """Stopped at the turn limit with every test passed, finished with 3 of 4, finished with 1."""
    return [
        _executed("a", "turn_limit", 4),
        _executed("b", "finished", 3),
        _executed("c", "finished", 1),
    ]


@pytest.mark.parametrize(
    ("penalty", "expected"),
    [
        # rewards 1.0 (stopped at the turn limit, every test passed), 0.75, 0.25: baseline 2/3
        (0.0, {"a": 1 / 3, "b": 0.75 - 2 / 3, "c": 0.25 - 2 / 3}),
        # 1.0 - 0.5 = 0.5, 0.75, 0.25: baseline 0.5; the finished 0.75 now ranks first
        (0.5, {"a": 0.0, "b": 0.25, "c": -0.25}),
    ],
)
def test_stop_penalty_lowers_the_stopped_execution_in_its_group(penalty, expected):
    group = _group()
    batch = build_training_batch([group], trajectory=TrajectoryConfig(), stop_penalty=penalty)
    assert batch is not None and batch.trained_executions == 3
    assert batch.advantages == pytest.approx(expected, abs=1e-12)


def test_group_batch_reads_the_run_config():
    """The runtime and `--resume` build a group's batch through `group_batch`: the run's
    `rl.stop_penalty` reaches the advantages, and `num_executions` the loss weights."""
    config = msgspec.structs.replace(RunConfig(), rl=RLConfig(stop_penalty=0.5))
    group = _group()
    batch = group_batch(group, config, 6)
    assert batch.advantages == pytest.approx({"a": 0.0, "b": 0.25, "c": -0.25}, abs=1e-12)
    # each of the 3 executions' 2 policy tokens weighs 1 / (2 tokens x 6 executions)
    [mb] = batch.micro_batches
    weights = mb.loss_weight_T[mb.loss_positions()]
    assert weights.tolist() == pytest.approx([1 / 12] * 6)
