"""A run killed mid-step on the real engines (vLLM cell + DeepSpeed) resumes without losing or
re-training an execution (`python -m gyre.node --resume`). The test agent (`coin_agent.py`) makes
two chained model calls through the proxy, then a coin decides whether it solves its `learnable`
task. The invariants of a step on the real engines (tokens trained = tokens sampled, versions,
logprob match, weights change) are checked on the runtime's one cell in
tests/runtime/test_elastic_cells.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from gyre.runtime.checkpoint import ExecutionLedger
from gyre.runtime.metrics import StepMetrics, read_metrics
from gyre.tito.log import read_log

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def run_config(run_dir: Path, model_dir: Path, steps: int) -> dict:
    return {
        "run_dir": str(run_dir),
        "seed": 3,
        "model": {"path": str(model_dir), "init_if_missing": False},
        "engine": {"max_model_len": 1024},
        "loop": {
            "steps": steps,
            "batch_executions": 4,
            "group_size": 2,
            "heldout_tasks": 2,
            "eval_group_size": 1,
            "max_concurrent_executions": 4,
        },
        "tasks": {
            "suites": [str(REPO / "examples/tasks/learnable")],
            "harness": {
                "agent_command": ["python", str(Path(__file__).with_name("coin_agent.py"))]
            },
        },
        "trainer": {"learning_rate": 1e-3},
        "warm_start": {"enabled": False},
    }


def test_killed_mid_step_resumes_without_loss_or_double_training(tmp_path, tiny_model_dir) -> None:
    pytest.importorskip("vllm")
    pytest.importorskip("deepspeed")
    run_dir = tmp_path / "run"
    config_path = tmp_path / "run.toml"
    config_path.write_bytes(msgspec.toml.encode(run_config(run_dir, tiny_model_dir, steps=3)))
    cmd = [sys.executable, "-m", "gyre.node", "--config", str(config_path)]
    ledger = ExecutionLedger(run_dir)
    with open(tmp_path / "first.log", "wb") as log:
        first = subprocess.Popen(
            cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + 600
        while not ledger.entries(2) and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.2)
        assert ledger.entries(2), "the first run never reached step 2"
        os.killpg(first.pid, signal.SIGKILL)  # the node and every agent: a hard crash mid-step
        first.wait()
    finished_before = {e.outcome.execution_id for e in ledger.entries(2)}
    result = subprocess.run(
        [*cmd, "--resume"], cwd=REPO, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr[-3000:]

    steps = [r.step for r in read_metrics(run_dir) if isinstance(r, StepMetrics)]
    assert steps == [1, 2, 3]  # the counter continues; no step is written twice
    for step in (1, 2, 3):
        entries = ledger.entries(step)
        slots = [(e.task_id, e.slot) for e in entries]
        assert (
            len(slots) == len(set(slots)) == 4
        )  # each group slot filled once: nothing trained twice
    assert finished_before <= {
        e.outcome.execution_id for e in ledger.entries(2)
    }  # reused, not rerun
    log = read_log(run_dir / "calls.log")
    assert log.torn_bytes == 0 and log.unresolved == 0
