"""The registry of the shipped suites: which exist, and writing them to folders.

Owns `SUITES` (suite name -> generator of its tasks from a seed), `generate_suite` and
`generate_all`. Each family draws its tasks in its own module; `files.write_task` writes them.
Knows nothing about agents or models.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from gyre.tasks.suites.files import TaskFiles, write_task
from gyre.tasks.suites.learnable import learnable_suite
from gyre.tasks.suites.learnable_long import learnable_long_suite
from gyre.tasks.suites.longtail import longtail_task
from gyre.tasks.suites.nl2repo import nl2repo_task
from gyre.tasks.suites.terminal import terminal_task

__all__ = ["SUITES", "generate_suite", "generate_all"]


SUITES: dict[str, Callable[[int], list[TaskFiles]]] = {
    "nl2repo-mini": lambda seed: [nl2repo_task(i, seed, "nl2repo-mini", False) for i in range(55)],
    "terminal-mini": lambda seed: [terminal_task(i, seed) for i in range(33)],
    "multiagent-mini": lambda seed: [
        nl2repo_task(i, seed, "multiagent-mini", True) for i in range(21)
    ],
    "learnable": learnable_suite,
    "learnable-long": learnable_long_suite,
    "longtail": lambda seed: [longtail_task(i, seed) for i in range(16)],
}
"""Suite name -> generator of its tasks from a seed."""


def generate_suite(name: str, out: str | Path, seed: int = 0) -> Path:
    """Write suite `name` generated from `seed` to `out/<name>/`, replacing what was there.

    Raises `ValueError` for an unknown suite name."""
    if name not in SUITES:
        raise ValueError(f"name={name!r} is not a suite; known: {sorted(SUITES)}")
    suite_dir = Path(out) / name
    if suite_dir.exists():
        shutil.rmtree(suite_dir)
    suite_dir.mkdir(parents=True)
    for t in SUITES[name](seed):
        write_task(suite_dir, t)
    return suite_dir


def generate_all(out: str | Path, seed: int = 0) -> list[Path]:
    """Write every suite of `SUITES` under `out`."""
    return [generate_suite(name, out, seed) for name in SUITES]
