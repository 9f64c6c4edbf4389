"""Task format and loader: one folder per task, in the spirit of Terminal-Bench / Harbor.

    <task>/instruction.md    what the agent is told (non-empty UTF-8 Markdown)
    <task>/task.toml         limits and verifier settings (`TaskSpec`; unknown keys rejected)
    <task>/environment/      workspace template, copied per execution (no symlinks out of it)
    <task>/tests/            hidden verifier: `test_*.py` files (pytest) or `test.sh` (script)
    <task>/solution/         optional reference solution (`oracle.json`), never shown to agents

Owns `TaskSpec` (and its sections), `Task`, `load_task` and `load_suite`. Every validation
problem is one `TaskError` naming the path and the key. Knows nothing about agents, processes or
how scores become rewards.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import msgspec

from gyre.errors import TaskError

__all__ = [
    "Metadata",
    "AgentLimits",
    "TrainingSpec",
    "VerifierSpec",
    "TaskSpec",
    "Task",
    "load_task",
    "load_suite",
]


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base: frozen, keyword-only, unknown keys rejected."""


def _check_positive(**fields: float | None) -> None:
    for name, value in fields.items():
        if value is not None and value <= 0:
            raise ValueError(f"{name}={value!r} must be > 0")


class Metadata(_Section, frozen=True):
    """Descriptive fields; not used by the harness."""

    difficulty: int = 1
    """1 (easiest) .. 5."""
    tags: tuple[str, ...] = ()
    description: str = ""

    def __post_init__(self) -> None:
        if not 1 <= self.difficulty <= 5:
            raise ValueError(f"difficulty={self.difficulty} must be in [1, 5]")


class AgentLimits(_Section, frozen=True):
    """When an execution is stopped and partially scored."""

    deadline_s: float = 600.0
    """Wall-clock limit of the agent process, seconds (`timeout`)."""
    max_turns: int | None = None
    """Most model calls over the execution, sub-agents included (`turn_limit`); None: no limit."""
    token_budget: int | None = None
    """Most sampled (completion) tokens over all model calls (`token_budget`); None: no limit."""

    def __post_init__(self) -> None:
        _check_positive(
            deadline_s=self.deadline_s, max_turns=self.max_turns, token_budget=self.token_budget
        )


class TrainingSpec(_Section, frozen=True):
    """How the task is used for RL."""

    group_size: int = 4
    """Executions of this task per step; their rewards form the group baseline."""

    def __post_init__(self) -> None:
        _check_positive(group_size=self.group_size)


class VerifierSpec(_Section, frozen=True):
    """The hidden verifier in `tests/`."""

    kind: Literal["pytest", "script"] = "pytest"
    """`pytest`: `tests/test_*.py`, score = passed / total; `script`: `tests/test.sh` writes a
    reward."""
    timeout_s: float = 120.0
    """Wall-clock limit of the whole verifier run; exceeding it fails the execution."""
    test_timeout_s: float = 30.0
    """Per-test limit (pytest-timeout); a test over it fails, the run goes on."""
    num_tests: int | None = None
    """Declared number of hidden tests: the denominator even if some cannot be collected."""

    def __post_init__(self) -> None:
        _check_positive(
            timeout_s=self.timeout_s, test_timeout_s=self.test_timeout_s, num_tests=self.num_tests
        )


class TaskSpec(_Section, frozen=True):
    """The contents of `task.toml`."""

    version: int = 1
    metadata: Metadata = Metadata()
    agent: AgentLimits = AgentLimits()
    training: TrainingSpec = TrainingSpec()
    verifier: VerifierSpec = VerifierSpec()

    def __post_init__(self) -> None:
        if self.version != 1:
            raise ValueError(f"version={self.version} is not supported (only 1)")


class Task(msgspec.Struct, frozen=True, kw_only=True):
    """A validated task folder. Paths are absolute strings; use the `Path` properties."""

    task_id: str
    """`<suite folder name>/<task folder name>`."""
    root: str
    instruction: str
    spec: TaskSpec

    @property
    def path(self) -> Path:
        return Path(self.root)

    @property
    def environment_dir(self) -> Path:
        """Workspace template (copied, never modified)."""
        return self.path / "environment"

    @property
    def tests_dir(self) -> Path:
        """Hidden verifier; never copied into a workspace."""
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        """Reference solution (may not exist); never copied into a workspace."""
        return self.path / "solution"


def _check_tree_inside(top: Path) -> None:
    """Reject symlinks in `top` that resolve outside it (a copy would leak files into
    workspaces)."""
    real_top = top.resolve()
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if p.is_symlink():
                target = p.resolve()
                if not target.is_relative_to(real_top):
                    raise TaskError(f"{p}: symlink points outside {top.name}/ (to {target})")


def load_task(path: str | os.PathLike[str]) -> Task:
    """Load and validate one task folder.

    Raises `TaskError` whose message starts with the offending path: folder or file missing,
    `instruction.md` empty or not UTF-8, `task.toml` not TOML / unknown key / bad value, `tests/`
    this user cannot read, no verifier in `tests/` for the declared kind, symlinks escaping
    `environment/`.
    """
    root = Path(path).absolute()
    if not root.is_dir():
        raise TaskError(f"{root}: task folder does not exist or is not a directory")
    instruction_path = root / "instruction.md"
    try:
        instruction = instruction_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskError(f"{instruction_path}: missing (every task needs an instruction)") from None
    except UnicodeDecodeError as exc:
        raise TaskError(
            f"{instruction_path}: not UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None
    if not instruction.strip():
        raise TaskError(f"{instruction_path}: empty")
    toml_path = root / "task.toml"
    try:
        spec = msgspec.toml.decode(toml_path.read_bytes(), type=TaskSpec)
    except FileNotFoundError:
        raise TaskError(f"{toml_path}: missing") from None
    except msgspec.ValidationError as exc:
        raise TaskError(f"{toml_path}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise TaskError(f"{toml_path}: not valid TOML: {exc}") from None
    env_dir = root / "environment"
    if not env_dir.is_dir():
        raise TaskError(f"{env_dir}: missing (the workspace template; may be empty)")
    _check_tree_inside(env_dir)
    tests_dir = root / "tests"
    if not tests_dir.is_dir():
        raise TaskError(f"{tests_dir}: missing (the hidden verifier)")
    if not os.access(tests_dir, os.R_OK | os.X_OK):  # a listing would be empty, not refused
        st = os.stat(tests_dir)
        raise TaskError(
            f"{tests_dir}: uid {os.geteuid()} cannot read it (uid {st.st_uid}'s, mode "
            f"{st.st_mode & 0o777:o}; a run as root makes tests/ 0700 to hide it from agents)"
        )
    if spec.verifier.kind == "pytest":
        if not any(tests_dir.rglob("test_*.py")):
            raise TaskError(f"{tests_dir}: no test_*.py files for verifier kind 'pytest'")
    elif not (tests_dir / "test.sh").is_file():
        raise TaskError(f"{tests_dir / 'test.sh'}: missing for verifier kind 'script'")
    return Task(
        task_id=f"{root.parent.name}/{root.name}",
        root=str(root),
        instruction=instruction,
        spec=spec,
    )


def load_suite(path: str | os.PathLike[str]) -> list[Task]:
    """Load every task folder (a subfolder with a `task.toml`) of a suite, sorted by name.

    Raises `TaskError` for the first invalid task, or if the suite has no tasks.
    """
    root = Path(path).absolute()
    if not root.is_dir():
        raise TaskError(f"{root}: suite folder does not exist")
    tasks = [load_task(p) for p in sorted(root.iterdir()) if (p / "task.toml").exists()]
    if not tasks:
        raise TaskError(f"{root}: no task folders (subfolders with a task.toml)")
    return tasks
