"""The run's scores and restart reads: pass rates, whether a step was evaluated, the call log.

Owns `pass_rate` (a list of executions' pass rate and mean score), `evaluated` (whether
`metrics.jsonl` holds an evaluation at a step) and `resume_log` (the one streaming pass a restart
makes over the call log). Which tasks a run trains on is `gyre.rollout.tasks`. Knows nothing
about cells, scheduling or training: the driver calls these.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path

from gyre.rollout.source import Executed
from gyre.runtime.checkpoint import ExecutionLedger
from gyre.runtime.metrics import EvalMetrics, read_metrics
from gyre.tito.log import LogContents, read_log

__all__ = ["pass_rate", "evaluated", "resume_log"]

logger = logging.getLogger(__name__)


def pass_rate(executed: Sequence[Executed]) -> tuple[float, float]:
    """(fraction of scored executions whose hidden tests all passed, their mean score); failed
    executions are left out; (NaN, NaN) when none was scored."""
    scored = [ex.outcome.score for ex in executed if ex.outcome.score is not None]
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
