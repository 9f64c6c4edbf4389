"""A resumed run reads the call log once, streaming (issue #16): `resume_log` cuts a torn tail and
keeps the calls of the step being resumed."""

from __future__ import annotations

from pathlib import Path

import anyio

import gyre.tito.log as log_module
from gyre.runtime.checkpoint import ExecutionLedger, LedgerEntry
from gyre.runtime.data_stream import resume_log
from gyre.tasks.outcome import Outcome, Score
from gyre.tito.log import CallLog
from gyre.tito.records import ExecutionSummary, ModelCall, to_reference
from tests.trajectory.builders import make_call


def _summary(eid: str, calls: list[ModelCall]) -> ExecutionSummary:
    return ExecutionSummary(
        execution_id=eid,
        num_calls=len(calls),
        truncated=False,
        length_calls=0,
        context_refusals=0,
        divergences=0,
        prompt_tokens=sum(c.prompt_len for c in calls),
        completion_tokens=sum(len(c.completion_ids) for c in calls),
    )


def _execution(eid: str) -> list[ModelCall]:
    return to_reference(
        [
            make_call(eid, "c0", [1, 2, 3], [4, 5]),
            make_call(eid, "c1", [1, 2, 3, 4, 5, 6], [7], parent="c0"),
        ]
    )


def _entry(step: int, eid: str, slot: int) -> LedgerEntry:
    score = Score(passed=1, total=1, score=1.0, all_passed=True)
    outcome = Outcome(execution_id=eid, task_id="t", termination="finished", score=score)
    return LedgerEntry(step=step, task_id="t", slot=slot, outcome=outcome)


def test_a_resume_reads_the_call_log_once(tmp_path: Path, monkeypatch) -> None:
    old, done, open_ = _execution("s2-a"), _execution("s3-a"), _execution("s3-b")
    path = tmp_path / "calls.log"

    async def write() -> None:
        log = CallLog(path)
        for call in [*old, *done, *open_]:
            await log.append_call(call)
        await log.append_end(_summary("s2-a", old))
        await log.append_end(_summary("s3-a", done))  # s3-b was killed before its close
        log.close()

    anyio.run(write)
    whole = path.stat().st_size
    with open(path, "ab") as f:  # a kill mid-write: half a frame
        f.write(b"\x40\x00\x00\x00\x01\x02\x03")
    ledger = ExecutionLedger(tmp_path)
    ledger.append(_entry(2, "s2-a", 0))
    ledger.append(_entry(3, "s3-a", 0))
    ledger.append(_entry(3, "s3-b", 1))

    passes: list[str] = []
    real = log_module.iter_frames

    def counting(p, torn=None):
        passes.append(str(p))
        return real(p, torn)

    monkeypatch.setattr(log_module, "iter_frames", counting)
    log = resume_log(path, ledger, 3)
    assert log is not None and passes == [str(path)]
    assert path.stat().st_size == whole  # the torn frame is cut
    assert log.calls == done + open_ and list(log.summaries) == ["s3-a"]
