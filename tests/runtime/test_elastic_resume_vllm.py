"""kill -9 of the node mid-step and mid-switch on real engines, then `--resume` (slow: two starts
of two vLLM cells, each with a DeepSpeed trainer).

`python -m gyre.node` runs the runtime on two cells with the elastic policy (cells move between
rollout and training by the water level) and the test agent `coin_agent.py`; members 1 of each
group start 20 s after members 0, so executions stay in flight while the cells switch. The test
watches the run's timeline (`timeline.jsonl`, written and flushed record by record): once step 1
is checkpointed, a cell's last role change is `switching` (a switch has begun and not ended) and
the water level is above 0 (executions in flight), the node's whole process group (node, cells,
agents) is killed with SIGKILL. Then the run is resumed: the steps continue where the checkpoint
left them, the finished executions are reused, the ones in flight run again under new IDs, once
each, no group is trained twice, and the metrics, ledger, timeline and call log continue without
a duplicated or torn record. A third start says there is nothing to do. Ported from the one-cell
loop's kill/resume test.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from gyre.runtime.checkpoint import ExecutionLedger, latest_checkpoint
from gyre.runtime.elastic_resume import LAUNCHES_FILE, Launch
from gyre.runtime.metrics import EvalMetrics, StepMetrics, read_metrics
from gyre.runtime.timeline import Timeline, read_timeline
from gyre.tito.log import read_log

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
AGENT = Path(__file__).with_name("coin_agent.py")
B, G, STEPS = 4, 2, 3


def run_config(run_dir: Path, model_dir: Path) -> dict:
    later = f'case "$GYRE_EXECUTION_ID" in *-g1) sleep 20;; esac; exec {sys.executable} {AGENT}'
    return {
        "run_dir": str(run_dir),
        "seed": 3,
        "model": {"path": str(model_dir), "init_if_missing": False},
        "engine": {"max_model_len": 1024},
        "loop": {
            "steps": STEPS,
            "batch_executions": B,
            "group_size": G,
            "heldout_tasks": 2,
            "eval_group_size": 1,
            "max_concurrent_executions": 4,
        },
        "cells": {"num_cells": 2},
        "scheduler": {"policy": "elastic", "capacity_per_cell": 4},
        "tasks": {
            "suites": [str(REPO / "examples/tasks/learnable")],
            "harness": {"agent_command": ["sh", "-c", later], "visible_paths": [str(AGENT)]},
        },
        "trainer": {"learning_rate": 1e-3},
        "warm_start": {"enabled": False},
    }


def switching_cells(timeline: Timeline) -> set[int]:
    """The cells whose last role change is `switching`: a switch has begun and not ended."""
    last = {change.cell: change.role for change in timeline.roles}
    return {cell for cell, role in last.items() if role == "switching"}


def mid_switch_with_executions_in_flight(run_dir: Path) -> bool:
    """After step 1's checkpoint (so not the initial roles' switch), a switch under way and the
    water level (executions dispatched, not finished) above 0, as the timeline records them."""
    if latest_checkpoint(run_dir) is None:
        return False
    timeline = read_timeline(run_dir)
    return bool(switching_cells(timeline)) and timeline.water_level[-1] > 0


class TimelineTail:
    """Follows `timeline.jsonl` as it grows, decoding only the complete lines added since the
    last call: cheap enough to poll every few milliseconds (a switch on these cells lasts about
    30-60 ms)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "timeline.jsonl"
        self.offset = 0
        self.partial = b""
        self.roles: dict[int, str] = {}
        self.level = 0

    def mid_switch(self) -> bool:
        """True when a cell's last role change is `switching` and the water level is above 0."""
        try:
            grown = self.path.stat().st_size > self.offset
        except FileNotFoundError:
            return False
        if grown:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
            self.offset += len(data)
            *lines, self.partial = (self.partial + data).split(b"\n")
            for record in map(json.loads, lines):
                if record["type"] == "role":
                    self.roles[record["cell"]] = record["role"]
                elif record["type"] == "water":
                    self.level = record["level"]
        return "switching" in self.roles.values() and self.level > 0


def test_a_node_killed_mid_step_resumes_without_loss_or_double_training(
    tmp_path, tiny_model_dir
) -> None:
    pytest.importorskip("vllm")
    pytest.importorskip("deepspeed")
    run_dir = tmp_path / "run"
    config_path = tmp_path / "run.toml"
    config_path.write_bytes(msgspec.toml.encode(run_config(run_dir, tiny_model_dir)))
    cmd = [sys.executable, "-m", "gyre.node", "--config", str(config_path)]
    ledger = ExecutionLedger(run_dir)
    with open(tmp_path / "first.log", "wb") as log:
        first = subprocess.Popen(
            cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + 900
        tail, checkpointed = TimelineTail(run_dir), run_dir / "checkpoints" / "latest"
        seen = False
        while time.monotonic() < deadline and first.poll() is None:
            if tail.mid_switch() and checkpointed.exists():
                # freeze the node, its cells and agents where they are, then read the files
                # again: still mid-switch (the switch's end not written), kill; else go on
                os.killpg(first.pid, signal.SIGSTOP)
                if seen := mid_switch_with_executions_in_flight(run_dir):
                    break
                os.killpg(first.pid, signal.SIGCONT)
            time.sleep(0.002)
        with contextlib.suppress(ProcessLookupError):  # a node that ended early left no group
            os.killpg(first.pid, signal.SIGKILL)  # the node, its cells and every agent
        first.wait()  # killed before asserting: a missed switch leaves no run behind
        assert seen, (tmp_path / "first.log").read_text()[-3000:]
    # what the files say of the moment of the kill: a switch begun and not ended, executions out
    killed = read_timeline(run_dir)
    assert switching_cells(killed) and killed.water_level[-1] > 0
    state, _ = latest_checkpoint(run_dir)
    assert 1 <= state.step < STEPS and state.version == state.step
    before = ledger.entries()
    finished_before = {e.outcome.execution_id for e in before}
    assert len(before) < STEPS * B  # the kill left executions unfinished

    result = subprocess.run([*cmd, "--resume"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    records = read_metrics(run_dir)
    steps = [r for r in records if isinstance(r, StepMetrics)]
    assert [r.step for r in steps] == [1, 2, 3]  # the counter continues; no step written twice
    assert [r.version for r in steps] == [1, 2, 3]
    assert all(r.executions == B for r in steps)
    assert [r.step for r in records if isinstance(r, EvalMetrics)] == [0, 3]
    final, _ = latest_checkpoint(run_dir)
    assert (final.step, final.version) == (STEPS, STEPS)
    trained = set(range(final.task_cursor)) - set(final.open_groups)
    assert len(trained) == STEPS * B // G
    entries = ledger.entries()
    members = Counter((e.group, e.slot) for e in entries)
    # each member of every trained group is in the ledger exactly once: nothing trained twice
    assert all(members[(g, m)] == 1 for g in trained for m in range(G))
    # finished before the kill: reused, never run again (their members have no second entry)
    assert all(members[(e.group, e.slot)] == 1 for e in before)
    launches = [
        msgspec.json.decode(line, type=Launch)
        for line in (run_dir / LAUNCHES_FILE).read_bytes().splitlines()
    ]
    assert len(launches) == 2 and launches[0].launch != launches[1].launch
    resumed = launches[1]
    assert resumed.resumed_from_step == state.step
    assert {r.was for r in resumed.rerun if r.was} == set(state.in_flight) - finished_before
    # the resume starts after the checkpoint's dispatched executions, or after the last finished
    # one in dispatch order when some finished beyond them; later members are dispatched anew
    last = max(e.group * G + e.slot for e in before)
    assert resumed.dispatched == max(state.dispatched, last + 1)
    # every member before that point not finished at the kill runs again, and only those (none
    # when all the checkpoint saw out had finished: those in flight at the kill are then all
    # beyond it, dispatched anew; stop 27's fresh clone caught that moment once)
    done = {(e.group, e.slot) for e in before}
    unfinished = {divmod(k, G) for k in range(resumed.dispatched)} - done
    assert {(r.group, r.member) for r in resumed.rerun} == unfinished
    ran_again = {r.execution_id for r in resumed.rerun}
    assert ran_again <= {e.outcome.execution_id for e in entries}  # each ran, once
    log = read_log(run_dir / "calls.log")
    assert log.torn_bytes == 0 and log.unresolved == 0
    ids = [c.execution_id for c in log.calls]
    assert len(set(ids) & ran_again) == len(ran_again)  # the new IDs recorded their calls

    # the timeline continues after the resume: the second start's cells take roles again
    assert len(read_timeline(run_dir).roles) > len(killed.roles)

    again = subprocess.run([*cmd, "--resume"], cwd=REPO, capture_output=True, text=True)
    assert again.returncode == 0 and "nothing to do" in again.stdout
