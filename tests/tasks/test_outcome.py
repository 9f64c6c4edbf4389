"""Outcome records, and a group of 5 executions through the harness into group advantages."""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec
import pytest

from gyre.rl.advantages import group_advantages, reward_of
from gyre.tasks.outcome import Outcome, Score
from gyre.tasks.solution import Solution, Step, encode_solution
from gyre.tasks.task import load_task
from tests.agents.drive import HALF_ORACLE_DEADLINE_S, oracle_policy, run_policy, with_deadline
from tests.agents.openai_server import tool_call_message
from tests.tasks.test_task import make_task


def test_outcome_invariants() -> None:
    score = Score(passed=1, total=4, score=0.25, all_passed=False)
    o = Outcome(execution_id="e", task_id="s/t", termination="timeout", score=score)
    assert o.stopped and not o.failed and o.reward == 0.25
    f = Outcome(
        execution_id="e", task_id="s/t", termination="failed", failure_reason="verifier crashed"
    )
    assert f.failed and f.reward is None
    with pytest.raises(ValueError, match="a reason is required exactly for failed"):
        Outcome(execution_id="e", task_id="s/t", termination="failed")
    with pytest.raises(ValueError, match="failed executions have no score"):
        Outcome(execution_id="e", task_id="s/t", termination="finished")
    with pytest.raises(ValueError, match="passed=5 must be in"):
        Score(passed=5, total=4, score=1.0, all_passed=True)
    assert msgspec.json.decode(msgspec.json.encode(o), type=Outcome) == o


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


@pytest.mark.slow
@pytest.mark.anyio
async def test_group_of_five_gives_the_documented_advantages(
    tmp_path: Path, harness, server, bridge
) -> None:
    tests = {
        "test_four.py": "".join(
            f"def test_{i}():\n    assert open('f{i}.txt').read() == '{i}'\n\n\n" for i in range(4)
        )
    }
    root = make_task(
        tmp_path / "suite" / "four",
        toml="[agent]\ndeadline_s = 60.0\n[verifier]\nnum_tests = 4\n",
        tests=tests,
    )
    (root / "solution").mkdir()
    solution = Solution(
        main=[
            Step(
                tool="write_file",
                arguments={"path": f"f{i}.txt", "content": str(i)},
                tests_passing=i + 1,
            )
            for i in range(4)
        ]
    )
    (root / "solution" / "oracle.json").write_bytes(encode_solution(solution))
    task = load_task(root)

    outcomes = [
        await run_policy(harness, server, bridge, task, "g0", oracle_policy(task)),
        await run_policy(harness, server, bridge, task, "g1", oracle_policy(task)),
        await run_policy(
            harness,
            server,
            bridge,
            with_deadline(task, HALF_ORACLE_DEADLINE_S),
            "g2",
            oracle_policy(task, stop_after=1),
        ),
        await run_policy(
            harness, server, bridge, task, "g3", lambda call: tool_call_message("finish", {}, "c")
        ),
        await harness.run(task, "g4", agent_command=[sys.executable, "-c", "raise SystemExit(2)"]),
    ]
    assert [o.termination for o in outcomes] == [
        "finished",
        "finished",
        "timeout",
        "finished",
        "failed",
    ]
    assert [reward_of(o) for o in outcomes] == [1.0, 1.0, 0.25, 0.0, None]
    group = group_advantages([o.execution_id for o in outcomes], [reward_of(o) for o in outcomes])
    assert group.baseline == 0.5625
    assert group.advantages == (0.4375, 0.4375, -0.3125, -0.5625, None)
