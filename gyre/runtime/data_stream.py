"""The run's data: which tasks are trained, which are held out, in what order, and how they scored.

Owns `configured_tasks` (every task of the configured suites, a bad suite named by its setting),
`split_tasks` (training and held-out tasks of the configured suites), `split_digest` (what a
resume compares them by), `pick_tasks` (the data stream: a seeded shuffle of the training tasks
per epoch), `pass_rate` (a list of executions' pass rate and mean score), `evaluated` (whether
`metrics.jsonl` holds an evaluation at a step) and `resume_log` (the one streaming pass a restart
makes over the call log). Knows nothing about cells, scheduling or training: the driver
(`gyre.runtime.elastic`) calls these.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import random
from collections.abc import Sequence
from pathlib import Path

from gyre.config import RunConfig
from gyre.errors import ConfigError, TaskError
from gyre.runtime.checkpoint import ExecutionLedger
from gyre.runtime.metrics import EvalMetrics, read_metrics
from gyre.runtime.rollout import Executed
from gyre.tasks.task import Task, load_suite
from gyre.tito.log import LogContents, read_log

__all__ = [
    "configured_tasks",
    "split_tasks",
    "split_digest",
    "pick_tasks",
    "pass_rate",
    "evaluated",
    "resume_log",
]

logger = logging.getLogger(__name__)


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


def pass_rate(executed: Sequence[Executed]) -> tuple[float, float]:
    """(fraction of scored executions whose hidden tests all passed, their mean score); failed
    executions are left out; (NaN, NaN) when none was scored."""
    scored = [ex.outcome.score for ex in executed if not ex.outcome.failed]
    if not scored:
        return math.nan, math.nan
    return sum(s.all_passed for s in scored) / len(scored), sum(s.score for s in scored) / len(
        scored
    )


def evaluated(run_dir: Path, step: int) -> bool:
    """Whether `<run_dir>/metrics.jsonl` holds an evaluation at `step` (False when the file is
    missing). Raises `RunDirError` for a corrupt line (`read_metrics`)."""
    try:
        return any(isinstance(r, EvalMetrics) and r.step == step for r in read_metrics(run_dir))
    except FileNotFoundError:
        return False


def resume_log(path: Path, ledger: ExecutionLedger, step: int) -> LogContents | None:
    """The one streaming pass a (re)start makes over the call log: cut a torn last frame (a kill
    mid-write) so new frames append after whole ones, and keep the calls and summaries of the
    executions `ledger` recorded for `step` (the step a resumed run continues; memory O(their
    tokens)). None when there is no log. Raises `LogCorruptError` for a corrupt frame before
    the end."""
    if not path.exists():
        return None
    wanted = {e.outcome.execution_id for e in ledger.entries(step)}
    log = read_log(path, executions=wanted)
    if log.torn_bytes:
        logger.warning("call log %s: dropping a torn last frame of %d bytes", path, log.torn_bytes)
        os.truncate(path, path.stat().st_size - log.torn_bytes)
    return log
