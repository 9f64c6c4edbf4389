"""Acceptance: the shipped suites are generated from a seed, valid, and solvable by the oracle.

For each suite, the reference agent driven by the scripted oracle scores 1.0 on sampled tasks, and
a half-oracle that stops answering mid-way is stopped at the deadline with the exact partial score
and reason `timeout`.
"""

from __future__ import annotations

import filecmp
import random
from pathlib import Path

import pytest

from gyre.tasks.solution import load_solution
from gyre.tasks.suites import SUITES, generate_suite, learnable_examples
from gyre.tasks.task import load_suite
from tests.agents.drive import HALF_ORACLE_DEADLINE_S, oracle_policy, run_policy, with_deadline

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"
MIN_TASKS = {
    "nl2repo-mini": 50,
    "terminal-mini": 30,
    "multiagent-mini": 20,
    "learnable": 30,
    "learnable-long": 32,
    "longtail": 16,
}


@pytest.fixture
def anyio_backend() -> str:
    return "trio"  # the node's loop; the harness itself is tested on both backends in tests/agents


@pytest.mark.parametrize("name", sorted(SUITES))
def test_shipped_suite_is_valid_and_matches_its_generator(name: str, tmp_path: Path) -> None:
    tasks = load_suite(EXAMPLES / name)
    assert len(tasks) >= MIN_TASKS[name]
    generate_suite(name, tmp_path, seed=0)
    cmp = filecmp.dircmp(EXAMPLES / name, tmp_path / name)

    def diffs(c: filecmp.dircmp) -> list[str]:
        out = c.left_only + c.right_only + c.diff_files + c.funny_files
        for sub in c.subdirs.values():
            out += diffs(sub)
        return out

    assert (
        diffs(cmp) == []
    )  # regenerate with: python -m gyre.tasks generate --out examples/tasks --seed 0
    for task in tasks:
        solution = load_solution(task)
        if task.spec.verifier.num_tests is not None:
            assert solution.main[-1].tests_passing == task.spec.verifier.num_tests
        assert not (task.environment_dir / "tests").exists()


def test_generation_depends_on_the_seed(tmp_path: Path) -> None:
    a = generate_suite("nl2repo-mini", tmp_path / "a", seed=1)
    b = generate_suite("nl2repo-mini", tmp_path / "b", seed=2)
    assert sorted(p.name for p in a.iterdir()) != sorted(p.name for p in b.iterdir())


def test_difficulty_is_graded() -> None:
    tasks = load_suite(EXAMPLES / "nl2repo-mini")
    by_level: dict[int, list[int]] = {}
    for t in tasks:
        by_level.setdefault(t.spec.metadata.difficulty, []).append(t.spec.verifier.num_tests)
    assert sorted(by_level) == [1, 2, 3, 4, 5]
    means = [sum(v) / len(v) for _, v in sorted(by_level.items())]
    assert means == sorted(means) and means[0] < means[-1]


def test_multiagent_solutions_delegate() -> None:
    for task in load_suite(EXAMPLES / "multiagent-mini"):
        solution = load_solution(task)
        assert sum(s.tool == "delegate" for s in solution.main) >= 2
        assert len(solution.sub_agents) == sum(s.tool == "delegate" for s in solution.main)


def test_learnable_examples_are_regular() -> None:
    examples = learnable_examples(50, seed=3)
    assert len(examples) == 50
    for instruction, solution in examples:
        assert instruction.startswith("Write the word ")
        assert [s.tool for s in solution.main] == ["write_file"]
    assert examples == learnable_examples(50, seed=3)


def _sample(name: str, k: int) -> list:
    tasks = load_suite(EXAMPLES / name)
    return random.Random(f"sample:{name}").sample(tasks, k)


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("name", sorted(SUITES))
async def test_oracle_scores_one(name, harness, server, bridge) -> None:
    for i, task in enumerate(_sample(name, 2)):
        outcome = await run_policy(
            harness, server, bridge, task, f"{name}-oracle-{i}", oracle_policy(task)
        )
        assert outcome.termination == "finished", outcome
        assert outcome.score is not None and outcome.score.score == 1.0 and outcome.score.all_passed
        assert outcome.model_calls == len(server.calls_for_execution(f"{name}-oracle-{i}"))
        roles = {c.role for c in server.calls_for_execution(f"{name}-oracle-{i}")}
        assert roles == (
            {"main", "sub_agent"} if name in ("multiagent-mini", "learnable-long") else {"main"}
        )


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("name", sorted(SUITES))
async def test_half_oracle_gets_exact_partial_score_at_deadline(
    name, harness, server, bridge
) -> None:
    task = next(t for t in _sample(name, 5) if len(load_suite_solution_steps(t)) >= 1)
    steps = load_suite_solution_steps(task)
    # learnable tasks have one step: stopped before `finish`, the workspace is complete (2 of 2)
    stop_after = max(1, len(steps) // 2)
    expected = steps[stop_after - 1].tests_passing
    task = with_deadline(task, HALF_ORACLE_DEADLINE_S)
    outcome = await run_policy(
        harness, server, bridge, task, f"{name}-half", oracle_policy(task, stop_after)
    )
    assert outcome.termination == "timeout", outcome
    total = task.spec.verifier.num_tests or outcome.score.total
    assert (outcome.score.passed, outcome.score.total) == (expected, total)
    assert outcome.score.score == expected / total


def load_suite_solution_steps(task):
    return load_solution(task).main


@pytest.mark.slow
@pytest.mark.anyio
async def test_half_of_the_hidden_tests_is_half_the_score(harness, server, bridge) -> None:
    task = with_deadline(
        next(
            t
            for t in load_suite(EXAMPLES / "nl2repo-mini")
            if t.task_id.endswith("002-brave-canyon")
        ),
        HALF_ORACLE_DEADLINE_S,
    )
    assert [s.tests_passing for s in load_solution(task).main][:2] == [
        0,
        4,
    ] and task.spec.verifier.num_tests == 8
    outcome = await run_policy(
        harness, server, bridge, task, "half", oracle_policy(task, stop_after=2)
    )
    assert outcome.termination == "timeout"
    assert (
        outcome.score.passed,
        outcome.score.total,
        outcome.score.score,
        outcome.score.all_passed,
    ) == (4, 8, 0.5, False)
