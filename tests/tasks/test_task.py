"""Task folder loading: valid folders load; every malformed one is a TaskError naming the path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gyre.errors import TaskError
from gyre.tasks.task import load_suite, load_task

TOML = """version = 1
[metadata]
difficulty = 2
tags = ["demo"]
[agent]
deadline_s = 30.0
max_turns = 5
token_budget = 1000
[training]
group_size = 3
[verifier]
num_tests = 2
"""


def make_task(root: Path, *, toml: str = TOML, tests: dict[str, str] | None = None) -> Path:
    (root / "environment").mkdir(parents=True)
    (root / "environment" / "data.txt").write_text("x\n")
    (root / "tests").mkdir()
    for name, text in (tests or {"test_a.py": "def test_a():\n    assert True\n"}).items():
        (root / "tests" / name).write_text(text)
    (root / "instruction.md").write_text("Do the thing.\n")
    (root / "task.toml").write_text(toml)
    return root


def test_valid_task_loads(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path / "suite" / "t1"))
    assert task.task_id == "suite/t1"
    assert task.instruction == "Do the thing.\n"
    assert task.spec.agent.deadline_s == 30.0
    assert task.spec.agent.max_turns == 5
    assert task.spec.agent.token_budget == 1000
    assert task.spec.training.group_size == 3
    assert task.spec.metadata.tags == ("demo",)
    assert task.spec.verifier.kind == "pytest" and task.spec.verifier.num_tests == 2
    assert task.environment_dir == tmp_path / "suite" / "t1" / "environment"


def test_defaults_for_a_minimal_toml(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path / "t", toml=""))
    assert task.spec.agent.deadline_s == 600.0 and task.spec.agent.max_turns is None
    assert task.spec.training.group_size == 4


@pytest.mark.parametrize(
    "breakage, fragment",
    [
        (lambda r: (r / "instruction.md").unlink(), "instruction.md: missing"),
        (lambda r: (r / "instruction.md").write_text("  \n"), "instruction.md: empty"),
        (
            lambda r: (r / "instruction.md").write_bytes(b"\xff\xfe bad"),
            "instruction.md: not UTF-8",
        ),
        (lambda r: (r / "task.toml").unlink(), "task.toml: missing"),
        (lambda r: (r / "task.toml").write_text("[agent\n"), "task.toml: not valid TOML"),
        (
            lambda r: (r / "task.toml").write_text("[agent]\ndeadline = 3\n"),
            "unknown field `deadline`",
        ),
        (
            lambda r: (r / "task.toml").write_text("[agent]\ndeadline_s = -1\n"),
            "deadline_s=-1.0 must be > 0",
        ),
        (
            lambda r: (r / "task.toml").write_text("[agent]\nmax_turns = 'many'\n"),
            "$.agent.max_turns",
        ),
        (lambda r: (r / "task.toml").write_text("[metadata]\ndifficulty = 9\n"), "difficulty=9"),
        (lambda r: (r / "task.toml").write_text("version = 2\n"), "version=2"),
        (lambda r: (r / "task.toml").write_text("[verifier]\nkind = 'magic'\n"), "$.verifier.kind"),
        (lambda r: __import__("shutil").rmtree(r / "environment"), "environment: missing"),
        (lambda r: __import__("shutil").rmtree(r / "tests"), "tests: missing"),
        (lambda r: (r / "tests" / "test_a.py").rename(r / "tests" / "a.py"), "no test_*.py files"),
        (
            lambda r: (r / "task.toml").write_text("[verifier]\nkind = 'script'\n"),
            "test.sh: missing for verifier kind 'script'",
        ),
        (
            lambda r: os.symlink("/etc/passwd", r / "environment" / "leak"),
            "symlink points outside environment/",
        ),
        (
            lambda r: os.symlink("../tests", r / "environment" / "peek"),
            "symlink points outside environment/",
        ),
    ],
)
def test_malformed_task_is_a_clear_error(tmp_path: Path, breakage, fragment: str) -> None:
    root = make_task(tmp_path / "t")
    breakage(root)
    with pytest.raises(TaskError) as info:
        load_task(root)
    message = str(info.value)
    assert str(root) in message
    assert fragment in message


def test_symlink_inside_environment_is_allowed(tmp_path: Path) -> None:
    root = make_task(tmp_path / "t")
    os.symlink("data.txt", root / "environment" / "alias.txt")
    assert load_task(root).task_id.endswith("/t")


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="does not exist"):
        load_task(tmp_path / "nope")


def test_suite_loads_sorted_and_names_bad_member(tmp_path: Path) -> None:
    make_task(tmp_path / "s" / "b")
    make_task(tmp_path / "s" / "a")
    (tmp_path / "s" / "notes").mkdir()  # no task.toml: not a task
    assert [t.task_id for t in load_suite(tmp_path / "s")] == ["s/a", "s/b"]
    (tmp_path / "s" / "b" / "instruction.md").unlink()
    with pytest.raises(TaskError, match=r"s/b/instruction.md: missing"):
        load_suite(tmp_path / "s")
    with pytest.raises(TaskError, match="no task folders"):
        load_suite(tmp_path / "s" / "notes")


def test_tests_folder_this_user_cannot_read_is_named_as_such() -> None:
    """A run as root makes a task's tests/ 0700 (isolation); the same suite loaded by another user
    was refused as "no test_*.py files" (its listing is empty, not refused: found by a tester).
    Run as `nobody` (setpriv), the error says who cannot read it and why it is so."""
    import shutil
    import subprocess
    import sys
    import tempfile

    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv")
    repo = str(Path(__file__).parents[2])
    env = {**os.environ, "PYTHONPATH": repo}
    reach = [*nobody, sys.executable, "-c", "import gyre.tasks.task"]
    if subprocess.run(reach, env=env, cwd="/", capture_output=True).returncode != 0:
        pytest.skip("nobody cannot run this interpreter with gyre (a checkout in a 0700 folder)")
    top = Path(tempfile.mkdtemp(prefix="gyre-task-", dir="/tmp"))
    try:
        os.chmod(top, 0o755)
        task = make_task(top / "suite" / "t")
        subprocess.run(["chmod", "-R", "a+rX", str(top)], check=True)
        os.chmod(task / "tests", 0o700)
        probe = (
            "import sys\nfrom gyre.tasks.task import load_task\n"
            "try:\n    load_task(sys.argv[1])\nexcept Exception as exc:\n    print(exc)\n"
        )
        done = subprocess.run(
            [*nobody, sys.executable, "-c", probe, str(task)],
            capture_output=True,
            text=True,
            env=env,
            cwd=repo,
            timeout=60,
        )
    finally:
        shutil.rmtree(top)
    assert done.stdout.strip() == (
        f"{task / 'tests'}: uid 65534 cannot read it (uid 0's, mode 700; a run as root makes "
        "tests/ 0700 to hide it from agents)"
    ), done.stderr
