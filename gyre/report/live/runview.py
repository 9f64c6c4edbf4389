"""What the live run page reads: one run folder, growing or finished, plus the runtime's snapshot.

Owns `RunView`: the steps and evaluations (`metrics.jsonl`), the cells' timeline
(`timeline.jsonl`), the executions (the call log through `CallIndex`, outcomes from
`executions.jsonl` or the live feed) with their state, and one execution's `TreeView` (a bounded
cache, rebuilt when the execution made more calls). Every method reads files and must run in a
worker thread; a lock keeps one reader at a time. The live snapshot (`feed.snapshot()`, taken on
the event loop) is passed in. Knows nothing about HTTP or how the run was produced.
"""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict
from collections.abc import Container
from pathlib import Path
from typing import Any

import msgspec

from gyre.report.live.calls import CallIndex
from gyre.report.live.tree_view import Decode, TreeView
from gyre.runtime.checkpoint import LEDGER_FILE, LedgerEntry
from gyre.runtime.metrics import METRICS_FILE, EvalMetrics, StepMetrics, read_metrics
from gyre.runtime.timeline import TIMELINE_FILE
from gyre.tasks.outcome import STOP_REASONS, Outcome

__all__ = ["RunView", "STATES", "state_of"]

STATES = ("running", "suspended", "finished", "partial", "failed", "closed")
"""Execution states on the page: `closed` = ended in the proxy, outcome not recorded."""
_TREES = 8
"""Trees kept built (each up to the size of one execution's tokens)."""
_LEDGER = msgspec.json.Decoder(LedgerEntry)
_JSON = msgspec.json.Decoder()


def state_of(outcome: Outcome | None, closed: bool, suspended: bool) -> str:
    """The page's state of one execution (see `STATES`)."""
    if outcome is not None:
        if outcome.failed:
            return "failed"
        return "partial" if outcome.termination in STOP_REASONS else "finished"
    if suspended:
        return "suspended"
    return "closed" if closed else "running"


def _json_num(x: float) -> float | None:
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _record(r: Any) -> dict:
    return {f: _json_num(getattr(r, f)) for f in r.__struct_fields__}


class RunView:
    """Reader of `run_dir` for the page. `jmax`, `role_limits` as the run's `[trajectory]`;
    `batch_executions` is the elastic runtime's loss denominator (None: the one-cell loop's,
    the trained executions of the step); `decode` turns token IDs into text."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        log_name: str = "calls.log",
        jmax: int = 8,
        role_limits: dict[str, int] | None = None,
        batch_executions: int | None = None,
        decode: Decode | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.calls = CallIndex(self.run_dir / log_name)
        self.jmax = jmax
        self.role_limits = role_limits
        self.batch_executions = batch_executions
        self.decode = decode
        self.lock = threading.Lock()
        self.outcomes: dict[str, Outcome] = {}
        self.step_of: dict[str, int] = {}
        self.task_of: dict[str, str] = {}
        self._ledger_offset = 0
        self._metrics: tuple[tuple[int, int], list] = ((-1, -1), [])
        self._timeline = _TimelineTail(self.run_dir / TIMELINE_FILE)
        self._trees: OrderedDict[str, tuple[int, TreeView]] = OrderedDict()

    # -- files --------------------------------------------------------------------------------

    def _stamp(self, name: str) -> tuple[int, int]:
        try:
            st = (self.run_dir / name).stat()
        except FileNotFoundError:
            return (-1, -1)
        return (st.st_size, st.st_mtime_ns)

    def _read_metrics(self) -> list:
        stamp = self._stamp(METRICS_FILE)
        if stamp != self._metrics[0]:
            self._metrics = (stamp, read_metrics(self.run_dir) if stamp[0] >= 0 else [])
        return self._metrics[1]

    def _read_ledger(self) -> None:
        path = self.run_dir / LEDGER_FILE
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return
        if size <= self._ledger_offset:
            return
        with open(path, "rb") as f:
            f.seek(self._ledger_offset)
            data = f.read(size - self._ledger_offset)
        whole = data[: data.rfind(b"\n") + 1]
        for line in whole.splitlines():
            if line.strip():
                entry = _LEDGER.decode(line)
                self._add_outcome(entry.outcome, entry.step)
        self._ledger_offset += len(whole)

    def _add_outcome(self, outcome: Outcome, step: int | None) -> None:
        self.outcomes[outcome.execution_id] = outcome
        self.task_of[outcome.execution_id] = outcome.task_id
        if step is not None:
            self.step_of[outcome.execution_id] = step

    def _refresh(self, live: dict | None) -> None:
        self.calls.refresh()
        self._read_ledger()
        for outcome in (live or {}).get("outcomes", ()):
            if outcome.execution_id not in self.outcomes:
                self._add_outcome(outcome, None)

    # -- views --------------------------------------------------------------------------------

    def steps(self) -> dict:
        """Every step and evaluation record, in file order."""
        with self.lock:
            records = self._read_metrics()
        return {
            "steps": [_record(r) for r in records if isinstance(r, StepMetrics)],
            "evals": [_record(r) for r in records if isinstance(r, EvalMetrics)],
        }

    def cells(self, cursor: dict[str, int], live: dict | None) -> dict:
        """Timeline records after `cursor` (`intervals`, `roles`, `water`: counts already sent)
        and the live snapshot's cells, water level and routing counters."""
        with self.lock:
            tl = self._timeline
            tl.refresh()
            i, r, w = (max(0, int(cursor.get(k, 0))) for k in ("intervals", "roles", "water"))
            out: dict[str, Any] = {
                "live": None,
                "intervals": tl.intervals[i:],
                "roles": tl.roles[r:],
                "water": tl.water[w:],
                "cursor": {
                    "intervals": len(tl.intervals),
                    "roles": len(tl.roles),
                    "water": len(tl.water),
                },
                "num_cells": tl.num_cells,
            }
        if live is not None:
            out["live"] = {
                k: v for k, v in live.items() if k not in ("outcomes", "suspended", "where")
            }
            out["num_cells"] = max(out["num_cells"], len(live.get("cells", ())))
        return out

    def _state(self, eid: str, suspended: Container[str]) -> str:
        ex = self.calls.executions.get(eid)
        closed = ex is not None and ex.summary is not None
        return state_of(self.outcomes.get(eid), closed, eid in suspended)

    def _row(self, eid: str, live: dict | None) -> dict:
        ex = self.calls.executions.get(eid)
        outcome = self.outcomes.get(eid)
        suspended = eid in (live or {}).get("suspended", ())
        closed = ex is not None and ex.summary is not None
        score = None if outcome is None or outcome.score is None else outcome.score
        return {
            "execution_id": eid,
            "state": state_of(outcome, closed, suspended),
            "task_id": self.task_of.get(eid),
            "step": self.step_of.get(eid),
            "termination": None if outcome is None else outcome.termination,
            "reason": None if outcome is None else outcome.failure_reason,
            "score": None if score is None else score.score,
            "passed": None if score is None else score.passed,
            "total": None if score is None else score.total,
            "calls": 0 if ex is None else ex.calls,
            "prompt_tokens": 0 if ex is None else ex.prompt_tokens,
            "completion_tokens": 0 if ex is None else ex.completion_tokens,
            "roles": {} if ex is None else dict(ex.roles),
            "divergences": {} if ex is None else dict(ex.divergences),
            "cell": (live or {}).get("where", {}).get(eid),
        }

    def _ids(self) -> list[str]:
        seen = set(self.calls.order)
        return self.calls.order + [e for e in self.outcomes if e not in seen]

    def executions(
        self,
        *,
        state: str = "",
        query: str = "",
        page: int = 0,
        page_size: int = 50,
        live: dict | None = None,
    ) -> dict:
        """One page of executions filtered by `state` (one of `STATES`, '' for all) and `query`
        (a substring of the execution or task id), newest first, with counts per state."""
        with self.lock:
            self._refresh(live)
            ids = self._ids()[::-1]
            suspended = (live or {}).get("suspended", ())
            states = [self._state(e, suspended) for e in ids]
            counts = dict.fromkeys(STATES, 0)
            for st in states:
                counts[st] += 1
            keep = [
                e
                for e, st in zip(ids, states)
                if (not state or st == state)
                and (not query or query in e or query in (self.task_of.get(e) or ""))
            ]
            lo = page * page_size
            rows = [self._row(e, live) for e in keep[lo : lo + page_size]]
        return {
            "total": len(keep),
            "page": page,
            "page_size": page_size,
            "counts": counts,
            "rows": rows,
        }

    def _trained(self, eid: str) -> bool:
        """Whether the one-cell loop trains `eid` (`gyre.runtime.batch`'s exclusions: failed, no
        sampled token, greedy or truncated sampling)."""
        ex = self.calls.executions.get(eid)
        outcome = self.outcomes.get(eid)
        if ex is None or outcome is None or outcome.failed:
            return False
        return ex.completion_tokens > 0 and not ex.untrainable_sampling

    def _denominator(self, eid: str) -> int:
        """The loss denominator of `eid`'s step: the elastic runtime's batch size, or (the
        one-cell loop) the executions of its step that train."""
        if self.batch_executions is not None:
            return self.batch_executions
        step = self.step_of.get(eid)
        if step is None:
            return 1
        return max(1, sum(1 for e, s in self.step_of.items() if s == step and self._trained(e)))

    def tree(self, eid: str, live: dict | None = None) -> TreeView:
        """The execution's `TreeView` (cached until it makes another call). Raises `KeyError`
        for an execution the run has no calls of."""
        with self.lock:
            self._refresh(live)
            ex = self.calls.executions[eid]
            hit = self._trees.get(eid)
            if hit is not None and hit[0] == ex.calls:
                self._trees.move_to_end(eid)
                return hit[1]
            view = TreeView.build(
                self.calls.calls_of(eid),
                jmax=self.jmax,
                role_limits=self.role_limits,
                num_executions=self._denominator(eid),
            )
            self._trees[eid] = (ex.calls, view)
            while len(self._trees) > _TREES:
                self._trees.popitem(last=False)
            return view

    def execution(self, eid: str, live: dict | None = None) -> dict:
        """The execution's row, its outcome's verifier result and its tree's outline.
        Raises `KeyError` for an unknown execution."""
        with self.lock:
            self._refresh(live)
            known = eid in self.calls.executions
        view = self.tree(eid, live) if known else None
        with self.lock:
            if view is None and eid not in self.outcomes:
                raise KeyError(eid)
            row = self._row(eid, live)
            outcome = self.outcomes.get(eid)
        verifier = None
        if outcome is not None and outcome.score is not None:
            s = outcome.score
            verifier = {
                "passed": s.passed,
                "total": s.total,
                "score": s.score,
                "all_passed": s.all_passed,
                "failed_tests": list(s.failed_tests),
                "partial": outcome.stopped,
            }
        return {"row": row, "verifier": verifier, "tree": None if view is None else view.outline()}

    def tokens(self, eid: str, segment: int, offset: int, limit: int) -> dict:
        """A window of one segment's tokens; raises `KeyError` / `IndexError` when unknown."""
        return self.tree(eid).tokens(segment, offset, limit, self.decode)


class _TimelineTail:
    """`timeline.jsonl` read as it grows (the records of `gyre.runtime.timeline`, as JSON rows):
    only the complete lines appended since the last `refresh` are parsed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._start()

    def _start(self) -> None:
        """Nothing read yet."""
        self.offset = 0
        self.intervals: list[list] = []
        """[cell, start_s, end_s, kind, step] per interval, in file order."""
        self.roles: list[list] = []
        """[t_s, cell, role] per role change."""
        self.water: list[list] = []
        """[t_s, level, rollout_capacity] per water record."""
        self.num_cells = 0

    def refresh(self) -> None:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return
        if size < self.offset:  # a new run in the folder: start over
            self._start()
        if size == self.offset:
            return
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        whole = data[: data.rfind(b"\n") + 1]
        for line in whole.splitlines():
            if not line.strip():
                continue
            rec = _JSON.decode(line)
            kind = rec.get("type")
            if kind == "interval":
                row = [rec["cell"], rec["start_s"], rec["end_s"], rec["kind"], rec.get("step")]
                self.intervals.append(row)
                self.num_cells = max(self.num_cells, rec["cell"] + 1)
            elif kind == "role":
                self.roles.append([rec["t_s"], rec["cell"], rec["role"]])
                self.num_cells = max(self.num_cells, rec["cell"] + 1)
            elif kind == "water":
                self.water.append([rec["t_s"], rec["level"], rec["rollout_capacity"]])
        self.offset += len(whole)
