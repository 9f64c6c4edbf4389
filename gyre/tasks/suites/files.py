"""A generated task before it is written, and writing it as a task folder.

Owns `TaskFiles` (instruction, metadata, environment, hidden tests and reference solution of one
generated task), `write_task` (the folder in the format `gyre.tasks.task` reads) and `TEST_SH`
(the entry point of script verifiers). Knows nothing about which suites exist or how their tasks
are drawn.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gyre.tasks.solution import Solution, encode_solution

__all__ = ["TaskFiles", "write_task", "TEST_SH"]


@dataclass
class TaskFiles:
    """Everything of one generated task before it is written."""

    name: str
    instruction: str
    difficulty: int
    tags: tuple[str, ...]
    deadline_s: float
    max_turns: int
    token_budget: int
    group_size: int
    environment: dict[str, str]
    tests: dict[str, str]
    solution: Solution
    verifier_kind: str = "pytest"
    num_tests: int | None = None
    verifier_timeout_s: float = 120.0
    test_timeout_s: float = 10.0


def _toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid TOML basic string for our ASCII text


def _task_toml(t: TaskFiles) -> str:
    lines = [
        "version = 1",
        "",
        "[metadata]",
        f"difficulty = {t.difficulty}",
        f"tags = [{', '.join(_toml_str(x) for x in t.tags)}]",
        "",
        "[agent]",
        f"deadline_s = {float(t.deadline_s)}",
        f"max_turns = {t.max_turns}",
        f"token_budget = {t.token_budget}",
        "",
        "[training]",
        f"group_size = {t.group_size}",
        "",
        "[verifier]",
        f"kind = {_toml_str(t.verifier_kind)}",
        f"timeout_s = {float(t.verifier_timeout_s)}",
        f"test_timeout_s = {float(t.test_timeout_s)}",
    ]
    if t.num_tests is not None:
        lines.append(f"num_tests = {t.num_tests}")
    return "\n".join(lines) + "\n"


def write_task(suite_dir: Path, t: TaskFiles) -> None:
    root = suite_dir / t.name
    root.mkdir(parents=True)
    (root / "instruction.md").write_text(t.instruction)
    (root / "task.toml").write_text(_task_toml(t))
    (root / "environment").mkdir()
    for rel, content in sorted(t.environment.items()):
        p = root / "environment" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
    if not t.environment:
        (root / "environment" / ".keep").write_text("")
    (root / "tests").mkdir()
    for rel, content in sorted(t.tests.items()):
        (root / "tests" / rel).write_text(content)
    (root / "solution").mkdir()
    (root / "solution" / "oracle.json").write_bytes(encode_solution(t.solution) + b"\n")


TEST_SH = (
    "#!/bin/bash\n"
    "# Hidden verifier: writes $GYRE_REWARD_DIR/reward.json\n"
    'exec "${GYRE_PYTHON:-python3}" "$GYRE_TESTS_DIR/check.py"\n'
)
"""`test.sh` of a script verifier: runs the hidden `check.py`, which writes the reward."""
