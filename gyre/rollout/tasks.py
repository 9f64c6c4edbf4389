"""Task selection: which tasks a run trains on, which it holds out, and in what order.

Owns `configured_tasks` (every task of the configured suites, a bad suite named by its setting),
`split_tasks` (training and held-out tasks), `split_digest` (what a resume compares them by) and
`pick_tasks` (the data stream: a seeded shuffle of the training tasks per epoch). Knows nothing
about executions, scores or the run's files: a resume compares `split_digest`s, not task folders.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

from gyre.config import RunConfig
from gyre.errors import ConfigError, TaskError
from gyre.tasks.task import Task, load_suite

__all__ = ["configured_tasks", "split_tasks", "split_digest", "pick_tasks"]


def configured_tasks(config: RunConfig) -> list[Task]:
    """Every task of `config.tasks.suites`, sorted by task id. Raises `TaskError` naming the
    setting (`tasks.suites[i]`) for a suite that is missing or holds an invalid task."""
    tasks = []
    for i, suite in enumerate(config.tasks.suites):
        try:
            tasks += load_suite(suite)
        except TaskError as exc:
            raise TaskError(f"tasks.suites[{i}] = {suite!r}: {exc}") from None
    return sorted(tasks, key=lambda t: t.task_id)


def split_tasks(config: RunConfig) -> tuple[list[Task], list[Task]]:
    """(training tasks, held-out tasks): every task of the configured suites, by task id;
    `heldout_tasks` of them, drawn by a fixed seed (the same split for every run seed), are held
    out. Raises `ConfigError` when no training task is left, `TaskError` for a bad suite."""
    tasks = configured_tasks(config)
    k = config.loop.heldout_tasks
    held = set(random.Random("gyre-heldout").sample(range(len(tasks)), min(k, len(tasks))))
    train = [t for i, t in enumerate(tasks) if i not in held]
    heldout = [t for i, t in enumerate(tasks) if i in held]
    if not train:
        raise ConfigError(
            f"loop.heldout_tasks={k} leaves no training task among {len(tasks)} "
            f"in {config.tasks.suites}"
        )
    return train, heldout


def split_digest(train: Sequence[Task], heldout: Sequence[Task]) -> dict[str, int | str]:
    """The split as a resume compares it: the number of training and held-out tasks and a sha256
    (first 16 hex digits) of their sorted task IDs. Where the suites sit on disk, how their paths
    are written and in which order they are listed do not enter it."""
    h = hashlib.sha256()
    for name, tasks in (("train", train), ("heldout", heldout)):
        h.update(
            name.encode() + b"\0" + "\0".join(sorted(t.task_id for t in tasks)).encode() + b"\1"
        )
    return {"train": len(train), "heldout": len(heldout), "sha256": h.hexdigest()[:16]}


def pick_tasks(train: Sequence[Task], cursor: int, n: int, seed: int) -> list[Task]:
    """Tasks `cursor .. cursor + n - 1` of the data stream: each epoch a seeded shuffle of
    `train`."""
    out = []
    for k in range(cursor, cursor + n):
        epoch, i = divmod(k, len(train))
        out.append(train[random.Random(f"{seed}:{epoch}").sample(range(len(train)), len(train))[i]])
    return out
