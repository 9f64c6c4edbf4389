"""The run folder's JSONL records after a kill mid-write: the torn last line is cut before the next
record is appended, so `--resume` never joins a fragment and a new record into one unreadable line
(seen by a new user: a resumed run then failed with "metrics.jsonl:10: not a metrics record", and so
did `gyre.report`, until the file was fixed by hand)."""

from __future__ import annotations

import logging

from gyre.runtime.checkpoint import ExecutionLedger, LedgerEntry
from gyre.runtime.metrics import EvalMetrics, MetricsWriter, read_metrics
from gyre.tasks.outcome import Outcome


def evaluation(step: int) -> EvalMetrics:
    return EvalMetrics(
        step=step,
        version=step,
        split="heldout",
        executions=4,
        pass_rate=0.5,
        mean_reward=0.5,
        eval_s=1.0,
    )


def test_metrics_append_after_a_torn_line(tmp_path, caplog) -> None:
    writer = MetricsWriter(tmp_path)
    writer.write(evaluation(0))
    whole = writer.path.read_bytes()
    with open(writer.path, "ab") as f:
        f.write(
            b'{"type":"eval","step":8,"version":8,"split":"heldout","pass_rate":0.5,"mean_r'
        )  # killed here
    assert [r.step for r in read_metrics(tmp_path)] == [0]  # a torn tail is skipped when read
    with caplog.at_level(logging.WARNING, logger="gyre.runtime.metrics"):
        writer.write(evaluation(8))
    assert "cutting a torn last line of 77 bytes" in caplog.text
    assert [r.step for r in read_metrics(tmp_path)] == [0, 8]
    assert writer.path.read_bytes().splitlines() == [
        whole.rstrip(b"\n"),
        whole.rstrip(b"\n").replace(b'"step":0,"version":0', b'"step":8,"version":8'),
    ]


def test_ledger_append_after_a_torn_line(tmp_path) -> None:
    ledger = ExecutionLedger(tmp_path)
    entry = LedgerEntry(
        step=1,
        task_id="s/t",
        slot=0,
        outcome=Outcome(execution_id="e0", task_id="s/t", termination="failed", failure_reason="x"),
    )
    ledger.append(entry)
    with open(ledger.path, "ab") as f:
        f.write(b'{"step":1,"task_id":"s/t","slot":1,"outc')
    second = LedgerEntry(
        step=1,
        task_id="s/t",
        slot=1,
        outcome=Outcome(execution_id="e1", task_id="s/t", termination="failed", failure_reason="y"),
    )
    ledger.append(second)
    assert ledger.entries(1) == [
        entry,
        second,
    ]  # before the fix the second joined the fragment: lost
    assert len(ledger.path.read_bytes().splitlines()) == 2


def test_an_empty_file_and_a_whole_last_line_are_left_alone(tmp_path) -> None:
    writer = MetricsWriter(tmp_path)
    writer.path.write_bytes(b"")
    writer.write(evaluation(0))
    writer.write(evaluation(1))
    assert [r.step for r in read_metrics(tmp_path)] == [0, 1]
