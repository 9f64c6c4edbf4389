"""A streak of failed executions stops the run (`loop.max_consecutive_failures`).

Found while running bench_learning from a second checkout: every agent failed before its first
model call (gyre was not importable for the agent's uid), and the run went on to skip all 8 steps
and both evaluations before anything said so. Now the streak stops the run with the reason."""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import pytest

from gyre.config import config_from_dict
from gyre.errors import ExecutionError
from gyre.rollout.harness import Rollout
from gyre.rollout.source import FailureStreak
from gyre.runtime.metrics import StepMetrics, read_metrics
from gyre.tasks.outcome import Outcome, Score
from gyre.tito.records import ExecutionSummary
from tests.runtime.fake_cells import failed_execution
from tests.runtime.test_elastic import REPO, drive, make_cells


def _summary(execution_id: str) -> ExecutionSummary:
    return failed_execution(execution_id, "t", "none").summary


class _Proxy:
    """What `Rollout.run` asks of the TITO proxy, with no calls ever made."""

    def mint_key(self, execution_id: str) -> str:
        return f"key-{execution_id}"

    def summary(self, execution_id: str) -> ExecutionSummary:
        return _summary(execution_id)

    async def end(self, execution_id: str) -> tuple[ExecutionSummary, list]:
        return _summary(execution_id), []


class _Harness:
    """Ends each execution as the next of `ends` says: "failed" or "finished"."""

    def __init__(self, ends: list[str]) -> None:
        self.ends = iter(ends)

    async def run(self, task, execution_id: str, *, control, api_key: str) -> Outcome:
        if next(self.ends) == "failed":
            return Outcome(
                execution_id=execution_id,
                task_id=task.task_id,
                termination="failed",
                failure_reason=f"agent exited (status 3) before its first model call ({api_key})",
            )
        score = Score(passed=1, total=1, score=1.0, all_passed=True)
        return Outcome(
            execution_id=execution_id, task_id=task.task_id, termination="finished", score=score
        )


class _Task:
    class spec:  # noqa: N801 - the shape of `Task.spec.agent` the rollout reads
        class agent:  # noqa: N801
            max_turns = 0
            token_budget = 0

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id


async def _run(ends: list[str], limit: int) -> list[str]:
    """Run `ends` ("failed a": an execution of task a that fails) one by one; their terminations
    (the rollout raises where the streak trips)."""
    plan = [end.split() for end in ends]
    harness = _Harness([end for end, _ in plan])
    rollout = Rollout(_Proxy(), harness, max_concurrent=1, max_consecutive_failures=limit)
    return [
        (await rollout.run(_Task(task), f"x{i}")).outcome.termination
        for i, (_, task) in enumerate(plan)
    ]


@pytest.mark.anyio
async def test_the_limit_th_failure_in_a_row_over_two_tasks_raises_with_its_reason() -> None:
    with pytest.raises(ExecutionError) as info:
        await _run(["failed a", "failed b", "failed b", "finished a"], limit=3)
    assert str(info.value) == (
        "3 executions of 2 tasks failed in a row (loop.max_consecutive_failures=3), the last x2 "
        "of b: agent exited (status 3) before its first model call (key-x2)"
    )


@pytest.mark.anyio
async def test_an_execution_that_did_not_fail_resets_the_streak() -> None:
    ends = ["failed a", "failed b", "finished a", "failed a", "failed b", "finished c"]
    assert await _run(ends, limit=3) == [end.split()[0] for end in ends]
    with pytest.raises(ExecutionError, match="3 executions of 3 tasks"):
        await _run([*ends, "failed a", "failed b", "failed c"], limit=3)


@pytest.mark.anyio
async def test_one_broken_task_never_stops_the_run() -> None:
    """A task whose every execution fails (its whole group) is that task's failure, not the
    run's: only a second task's failure in the same streak trips it."""
    assert await _run(["failed a"] * 20, limit=3) == ["failed"] * 20
    with pytest.raises(ExecutionError, match="21 executions of 2 tasks"):
        await _run(["failed a"] * 20 + ["failed b"], limit=3)


def test_the_streak_raises_once() -> None:
    """Executions that end after the stop (concurrent ones, ending while the run is cancelled)
    raise nothing more: the user sees one error."""
    streak = FailureStreak(2)
    failed = [failed_execution(f"x{i}", f"t{i}", "boom").outcome for i in range(4)]
    streak.observe(failed[0])
    with pytest.raises(ExecutionError, match="2 executions of 2 tasks"):
        streak.observe(failed[1])
    streak.observe(failed[2])
    streak.observe(failed[3])
    assert (streak.count, len(streak.tasks), streak.tripped) == (4, 4, True)


@pytest.mark.anyio
async def test_limit_zero_never_stops() -> None:
    ends = ["failed a", "failed b"] * 25
    assert await _run(ends, limit=0) == ["failed"] * 50
    with pytest.raises(ValueError, match="limit=-1 must be >= 0"):
        FailureStreak(-1)


def _execution_errors(exc: BaseException) -> list[ExecutionError]:
    if isinstance(exc, ExecutionError):
        return [exc]
    if isinstance(exc, BaseExceptionGroup):
        return [e for sub in exc.exceptions for e in _execution_errors(sub)]
    return []


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])  # slow tier: the node's backend only
async def test_a_run_whose_agents_cannot_start_stops_before_its_first_step(
    tmp_path: Path,
) -> None:
    from gyre.model.recipe import build_tokenizer

    run_dir = tmp_path / "run"
    cfg = config_from_dict(
        {
            "run_dir": str(run_dir),
            "loop": {
                "steps": 3,
                "batch_executions": 4,
                "group_size": 2,
                "max_consecutive_failures": 6,
            },
            "scheduler": {"policy": "elastic", "capacity_per_cell": 2},
            "tasks": {
                "suites": [str(REPO / "examples/tasks/learnable")],
                "harness": {"agent_command": ["python", "-c", "import sys; sys.exit(3)"]},
            },
        }
    )
    with pytest.raises(BaseException) as info:
        with anyio.fail_after(120):
            await drive(cfg, make_cells(build_tokenizer()))
    [error] = _execution_errors(info.value)
    assert re.search(r"^6 executions of [2-6] tasks failed in a row \(loop", str(error))
    assert "(loop.max_consecutive_failures=6), the last x" in str(error)
    assert "agent exited (status 3) before its first model call" in str(error)
    # 6 failures stop it within the second step's 4 executions (3 steps were asked for), or
    # before the first step's record: metrics.jsonl may not exist
    records = read_metrics(run_dir) if (run_dir / "metrics.jsonl").exists() else []
    steps = [r for r in records if isinstance(r, StepMetrics)]
    assert len(steps) <= 1 and all(s.failed == s.executions == 4 for s in steps)
