"""Run metrics: one JSON line per RL step or evaluation in `<run_dir>/metrics.jsonl`.

Owns `StepMetrics`, `EvalMetrics`, `MetricsWriter` (append + fsync per record, so a killed run
keeps every finished step), `read_metrics` and `append_line` (the JSONL append the execution
ledger shares: a torn tail is cut before the next record). The report and the live display read
these records; the loop writes them, and `MetricsWriter` streams each one to the run's metric
sinks (`gyre.runtime.sinks`). Knows nothing about how the numbers were produced.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec

from gyre.errors import RunDirError
from gyre.runtime.sinks import MetricSink, close_all, scalars

__all__ = [
    "StepMetrics",
    "EvalMetrics",
    "MetricsWriter",
    "read_metrics",
    "append_line",
    "METRICS_FILE",
]

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


class StepMetrics(msgspec.Struct, frozen=True, kw_only=True, tag="step"):
    """One RL step (one optimizer update on one batch of executions)."""

    step: int
    """1-based step number (continues across `--resume`)."""
    version: int
    """Weight version after the step."""
    executions: int
    """Executions in the batch."""
    pass_rate: float
    """Fraction of the batch's executions whose hidden tests all passed."""
    mean_reward: float
    """Mean score of the executions that count (failed ones excluded); NaN if none."""
    finished: int
    """Executions that ended on their own."""
    partial: int
    """Executions stopped at a deadline (time, turns, tokens, context) and partially scored."""
    failed: int
    """Executions failed for infrastructure reasons (out of baseline and loss)."""
    truncated: int
    """Executions with at least one call cut off by max_tokens or the context (field case B14)."""
    model_calls: int
    branches: int = -1
    """Root-to-leaf trajectories (leaves) of the trajectory trees of the step's trained executions,
    before Jmax selection; -1 in records written before it was recorded."""
    heals: int = -1
    """Model calls of the step's executions whose history the proxy healed back onto the recorded
    tokens (`ModelCall.heals` non-empty, `gyre.tito.heal`); -1 in records written before it was
    recorded."""
    requests_redirected: int = -1
    """Failures the router recovered from during the step, from its `RouterStatistics`: attempts
    moved to another cell because theirs left rollout or went down. -1 when not recorded (records
    written before it was, and the one-cell loop, which has no router)."""
    requests_retried: int = -1
    """Attempts retried after a stall or an error on a cell that stays in service; -1 as above."""
    requests_abandoned: int = -1
    """Model calls whose caller went away before their end (aborted on the cells); -1 as above."""
    aborts_failed: int = -1
    """Aborts a cell refused or did not answer (the cell was marked down); -1 as above."""
    migrations_missed: int = -1
    """Redirects handed a KV export that their target did not load (it prefilled instead: its KV
    folder is not the source's); -1 as above."""
    suspensions: int = -1
    """Executions suspended during the step (`gyre.runtime.suspension`: their cell left rollout
    and no rollout cell that stays had room); -1 as above."""
    policy_tokens: int
    """Tokens that carried loss in the step."""
    packed_tokens: int
    """Tokens forwarded by the trainer (shared prefixes once)."""
    dedup_ratio: float
    """Tokens of the selected trajectories run one by one / packed tokens (>= 1)."""
    logprob_abs_diff_mean: float
    """Mean |trainer - behaviour| logprob over loss tokens (off-policy mismatch, field case
    B07)."""
    mean_ratio: float
    """Mean importance ratio over loss tokens."""
    same_version_mismatch_mean: float = math.nan
    """The mismatch over loss tokens sampled by the trainer's own weight version: numerics alone
    (engine against trainer on the same weights); NaN when none (or not recorded)."""
    stale_mismatch_mean: float = math.nan
    """The mismatch over older loss tokens: numerics plus off-policy drift; NaN when none."""
    applied: bool
    """False when the optimizer step was skipped (non-finite loss or gradient)."""
    grad_norm: float = math.nan
    """Global gradient norm of the step's accumulated gradient, before clipping at
    `trainer.grad_clip` (DeepSpeed's `get_global_grad_norm`); NaN when the step was skipped, the
    trainer does not report it (ZeRO stage 0), or in records written before it was recorded."""
    rollout_s: float
    train_s: float
    sync_s: float
    step_s: float
    """Wall seconds of the step: rollout + train + sync (+ bookkeeping)."""


class EvalMetrics(msgspec.Struct, frozen=True, kw_only=True, tag="eval"):
    """A held-out evaluation at a weight version."""

    step: int
    """RL steps done when evaluated (0 = before RL)."""
    version: int
    split: Literal["heldout", "train"]
    executions: int
    pass_rate: float
    mean_reward: float
    eval_s: float


Record = StepMetrics | EvalMetrics
_encoder = msgspec.json.Encoder()
_json = msgspec.json.Decoder()


def _decode(line: bytes) -> Record:
    """One record; JSON has no NaN, so the null a NaN was written as (a step or evaluation whose
    executions all failed has no pass rate) reads back as NaN. No field is ever None."""
    raw = _json.decode(line)
    if isinstance(raw, dict):
        raw = {key: math.nan if value is None else value for key, value in raw.items()}
    return msgspec.convert(raw, Record)


class MetricsWriter:
    """Append-only JSONL writer; each record is flushed and fsynced before `write` returns, then
    streamed to every sink in `sinks` (closed by `close` or the `with` block's end)."""

    def __init__(self, run_dir: str | os.PathLike[str], sinks: Sequence[MetricSink] = ()) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.sinks = list(sinks)

    def write(self, record: Record, statistics: Mapping[str, Any] | None = None) -> None:
        """Append `record`; the sinks also get `statistics` (name -> a `statistics()` record of
        the runtime, flattened to `stats/<name>/<field>`) at the record's step."""
        append_line(self.path, _encoder.encode(record))
        if self.sinks:
            step, values = scalars(record, statistics)
            for sink in self.sinks:
                sink.write(step, values)

    def close(self) -> None:
        sinks, self.sinks = self.sinks, []
        close_all(sinks)

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def append_line(path: Path, line: bytes) -> None:
    """Append `line` and a newline to the JSONL file `path`, fsynced before returning. A torn last
    line (a kill mid-write) is cut first, with a warning, so the new record starts a line of its
    own instead of joining the fragment into a line nobody can read."""
    with open(path, "a+b") as f:  # writes go to the end, wherever a read left the position
        size = f.seek(0, os.SEEK_END)
        if size:
            f.seek(size - 1)
            if f.read(1) != b"\n":
                f.seek(0)
                keep = f.read().rfind(b"\n") + 1
                logger.warning("%s: cutting a torn last line of %d bytes", path, size - keep)
                f.truncate(keep)
        f.write(line + b"\n")
        f.flush()
        os.fsync(f.fileno())


def read_metrics(run_dir: str | os.PathLike[str]) -> list[Record]:
    """Every complete record of `<run_dir>/metrics.jsonl`, in order; a torn last line is skipped.

    Raises `FileNotFoundError` when the run has no metrics file, `NotADirectoryError` when
    `run_dir` is a file, and `RunDirError` naming the file and line when a line before the last is
    not a record (the file was edited or corrupted: nothing after it can be trusted in order).
    """
    path = Path(run_dir) / METRICS_FILE
    records = []
    lines = path.read_bytes().split(b"\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(_decode(line))
        except msgspec.DecodeError as exc:  # ValidationError included
            if i == len(lines) - 1:  # torn by a kill mid-write
                break
            raise RunDirError(f"{path}:{i + 1}: not a metrics record ({exc})") from None
    return records
