"""A streak of failed executions stops the run (`loop.max_consecutive_failures`).

Found while running bench_learning from a second checkout: every agent failed before its first
model call (gyre was not importable for the agent's uid), and the run went on to skip all 8 steps
and both evaluations before anything said so. Now the streak stops the run with the reason."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from gyre.config import config_from_dict
from gyre.errors import ExecutionError
from gyre.runtime.metrics import StepMetrics, read_metrics
from gyre.runtime.rollout import Rollout
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

    def calls(self, execution_id: str) -> list:
        return []

    async def close(self, execution_id: str) -> ExecutionSummary:
        return _summary(execution_id)


class _Harness:
    """Ends each execution as the next of `ends` says: "failed" or "finished"."""

    def __init__(self, ends: list[str]) -> None:
        self.ends = iter(ends)

    async def run(self, task, execution_id: str, *, control, api_key: str) -> Outcome:
        if next(self.ends) == "failed":
            return Outcome(
                execution_id=execution_id,
                task_id="t",
                termination="failed",
                failure_reason=f"agent exited (status 3) before its first model call ({api_key})",
            )
        score = Score(passed=1, total=1, score=1.0, all_passed=True)
        return Outcome(execution_id=execution_id, task_id="t", termination="finished", score=score)


class _Task:
    class spec:  # noqa: N801 - the shape of `Task.spec.agent` the rollout reads
        class agent:  # noqa: N801
            max_turns = 0
            token_budget = 0


async def _run(ends: list[str], limit: int) -> list[str]:
    """Run `ends` one by one; the terminations returned before the rollout raised (if it did)."""
    rollout = Rollout(_Proxy(), _Harness(ends), max_concurrent=1, max_consecutive_failures=limit)
    seen = []
    for i in range(len(ends)):
        seen.append((await rollout.run(_Task(), f"x{i}")).outcome.termination)
    return seen


@pytest.mark.anyio
async def test_the_limit_th_failure_in_a_row_raises_with_its_reason() -> None:
    with pytest.raises(ExecutionError) as info:
        await _run(["failed", "failed", "failed", "finished"], limit=3)
    message = str(info.value)
    assert "3 executions in a row failed (loop.max_consecutive_failures=3)" in message
    assert "the last x2 of t: agent exited (status 3) before its first model call (key-x2)" in (
        message
    )


@pytest.mark.anyio
async def test_an_execution_that_did_not_fail_resets_the_streak() -> None:
    ends = ["failed", "failed", "finished", "failed", "failed", "finished"]
    assert await _run(ends, limit=3) == ends
    with pytest.raises(ExecutionError, match="3 executions in a row"):
        await _run([*ends, "failed", "failed", "failed"], limit=3)


@pytest.mark.anyio
async def test_limit_zero_never_stops() -> None:
    assert await _run(["failed"] * 50, limit=0) == ["failed"] * 50


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
    assert "6 executions in a row failed (loop.max_consecutive_failures=6)" in str(error)
    assert "agent exited (status 3) before its first model call" in str(error)
    # 6 failures stop it within the second step's 4 executions (3 steps were asked for)
    steps = [r for r in read_metrics(run_dir) if isinstance(r, StepMetrics)]
    assert len(steps) <= 1 and all(s.failed == s.executions == 4 for s in steps)
