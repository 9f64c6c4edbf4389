"""The RL loop end to end on the real engines (vLLM cell + DeepSpeed), and kill/resume.

Two steps of a test agent (`coin_agent.py`: two chained model calls through the proxy, then a
coin decides whether it solves its `learnable` task, so groups have different rewards) on the real
engines: every execution is accounted for once, the trained tokens are exactly the agents' sampled
tokens (each call extends the previous one, so one path per execution), the weights change and
the engine samples step 2 at version 1, and the trainer's logprobs match vLLM's on the first batch
after a sync (< 1e-4 in fp32). Then a run killed mid-step resumes without losing or re-training an
execution.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import msgspec
import pytest
import torch

from gyre.config import config_from_dict
from gyre.runtime.checkpoint import ExecutionLedger
from gyre.runtime.metrics import EvalMetrics, StepMetrics, read_metrics
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


def test_two_steps_on_real_engines_keep_the_invariants(tmp_path, tiny_model_dir) -> None:
    pytest.importorskip("vllm")
    pytest.importorskip("deepspeed")
    from gyre.runtime.loop import run_rl

    config = config_from_dict(run_config(tmp_path / "run", tiny_model_dir, steps=2))
    state = anyio.run(run_rl, config, tiny_model_dir, backend="trio")
    assert (state.step, state.version) == (2, 2)

    records = read_metrics(config.run_dir)
    steps = [r for r in records if isinstance(r, StepMetrics)]
    evals = [r for r in records if isinstance(r, EvalMetrics)]
    assert [s.step for s in steps] == [1, 2] and [e.step for e in evals] == [0, 2]
    ledger = ExecutionLedger(Path(config.run_dir))
    for step in (1, 2):
        entries = ledger.entries(step)
        assert len(entries) == 4 and len({e.outcome.execution_id for e in entries}) == 4
        assert sorted((e.task_id, e.slot) for e in entries) == sorted(
            {(e.task_id, e.slot) for e in entries}
        )
    log = read_log(Path(config.run_dir) / config.proxy.log_name)
    for step, record in zip((1, 2), steps):
        trained = [e.outcome for e in ledger.entries(step) if not e.outcome.failed]
        calls = [c for o in trained for c in log.for_execution(o.execution_id)]
        # each call extends the previous one: every sampled token is trained exactly once
        assert record.policy_tokens == sum(len(c.completion_ids) for c in calls) > 0
        assert {v for c in calls for v in c.versions} == {
            step - 1
        }  # sampled by the published weights
        assert record.applied and record.logprob_abs_diff_mean < 1e-4

    from transformers import AutoModelForCausalLM

    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(
        Path(config.run_dir) / "snapshots" / "v2"
    ).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


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
