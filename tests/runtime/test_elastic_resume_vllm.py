"""kill -9 of the node mid-step on real engines, then `--resume` (slow: two starts of a vLLM cell
with a DeepSpeed trainer).

`python -m gyre.node` runs the runtime on one cell (the colocate policy: the cell switches between
rollout and training inside its process) with the test agent `coin_agent.py`; members 1 of each
group start 20 s after members 0, so when the first executions of step 2 are in the ledger the
others are still running. The node's whole process group (node, cell, agents) is killed with
SIGKILL, then the run is resumed: the steps continue where the checkpoint left them, the finished
executions are reused, the ones in flight run again under new IDs, once each, no group is trained
twice, and the metrics, ledger and call log continue without a duplicated or torn record. A third
start says there is nothing to do. Ported from the one-cell loop's kill/resume test.
"""

from __future__ import annotations

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
        "scheduler": {"capacity_per_cell": 4},
        "tasks": {
            "suites": [str(REPO / "examples/tasks/learnable")],
            "harness": {"agent_command": ["sh", "-c", later], "visible_paths": [str(AGENT)]},
        },
        "trainer": {"learning_rate": 1e-3},
        "warm_start": {"enabled": False},
    }


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
        while not ledger.entries(2) and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.1)
        assert ledger.entries(2), (tmp_path / "first.log").read_text()[-3000:]
        os.killpg(first.pid, signal.SIGKILL)  # the node, its cell and every agent
        first.wait()
    state, _ = latest_checkpoint(run_dir)
    assert (state.step, state.version) == (1, 1)
    before = ledger.entries()
    finished_before = {e.outcome.execution_id for e in before}
    assert len(ledger.entries(2)) < B  # the kill left executions of step 2 running

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
    assert resumed.resumed_from_step == 1
    assert {r.was for r in resumed.rerun if r.was} == set(state.in_flight) - finished_before
    # members after the last finished one in dispatch order were dispatched anew
    last = max(e.group * G + e.slot for e in before)
    assert resumed.dispatched == last + 1
    ran_again = {r.execution_id for r in resumed.rerun}
    assert ran_again <= {e.outcome.execution_id for e in entries}  # each ran, once
    log = read_log(run_dir / "calls.log")
    assert log.torn_bytes == 0 and log.unresolved == 0
    ids = [c.execution_id for c in log.calls]
    assert len(set(ids) & ran_again) == len(ran_again)  # the new IDs recorded their calls

    again = subprocess.run([*cmd, "--resume"], cwd=REPO, capture_output=True, text=True)
    assert again.returncode == 0 and "nothing to do" in again.stdout
