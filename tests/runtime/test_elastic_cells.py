"""The elastic runtime on real cells: two cell processes, each a vLLM engine and a DeepSpeed
trainer, one gloo gradient group, the colocate policy (so both cells roll out, both train, and the
satellite's gradient goes to the core every step), two steps of the coin agent.

Invariants: every step trains one whole batch and publishes it (versions 1, 2 on every engine,
snapshots written), the trainer's logprobs match vLLM's behaviour logprobs after each sync (fp32,
< 1e-4), the satellite's gradients reached the core (gradient traffic counted on both cells),
every role switch is in the timeline.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from transformers import AutoTokenizer

from gyre.config import config_from_dict
from gyre.runtime.cell_client import open_cells
from gyre.runtime.cell_handle import CellHandle
from gyre.runtime.elastic_job import run_cells
from gyre.runtime.loop import split_tasks
from gyre.runtime.metrics import StepMetrics, read_metrics
from gyre.runtime.timeline import read_timeline
from tests.conftest import require_vllm

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_two_real_cells_colocate_two_steps(tmp_path: Path, tiny_model_dir: Path) -> None:
    require_vllm()
    run_dir = tmp_path / "run"
    config = config_from_dict(
        {
            "run_dir": str(run_dir),
            "seed": 1,
            "model": {"path": str(tiny_model_dir), "init_if_missing": False},
            "engine": {"max_model_len": 1024, "kv_cache_memory_bytes": 64 * 2**20},
            "cells": {"num_cells": 2},
            "scheduler": {"policy": "colocate", "capacity_per_cell": 2},
            "loop": {"steps": 2, "batch_executions": 4, "group_size": 2},
            "tasks": {
                "suites": [str(REPO / "examples/tasks/learnable")],
                "harness": {
                    "agent_command": ["python", str(Path(__file__).with_name("coin_agent.py"))]
                },
            },
            "trainer": {"learning_rate": 1e-3},
            "warm_start": {"enabled": False},
        }
    )
    train, _ = split_tasks(config)

    async def main():
        async with open_cells(
            2,
            tiny_model_dir,
            config.engine,
            log_dir=run_dir / "cells",
            trainer_config=config.trainer,
            rl_config=config.rl,
        ) as clients:
            cells = [CellHandle(name=f"cell-{i}", client=c) for i, c in enumerate(clients)]
            runtime = await run_cells(
                config,
                cells,
                tokenizer=AutoTokenizer.from_pretrained(tiny_model_dir),
                tasks=train,
                snapshot=str(tiny_model_dir),
                launch="L",
            )
            stats = [await c.cell_statistics() for c in clients]
            return runtime, stats

    runtime, stats = anyio.run(main, backend="trio")
    metrics = [r for r in read_metrics(run_dir) if isinstance(r, StepMetrics)]
    assert [(m.step, m.version, m.executions, m.failed, m.applied) for m in metrics] == [
        (1, 1, 4, 0, True),
        (2, 2, 4, 0, True),
    ]
    assert all(m.pass_rate == 0.5 for m in metrics)  # the coin agent: odd slots solve their task
    assert all(m.policy_tokens > 0 and m.logprob_abs_diff_mean < 1e-4 for m in metrics)
    assert (run_dir / "snapshots" / "v2" / "model.safetensors").exists()
    assert runtime.weights.version == 2
    core, satellite = stats
    assert core.trainer_version == 2
    # a step's 2 groups go to whichever training cell is idle first (under load the core, switched
    # first, may take both): the 4 groups were trained (>= 1 micro-batch each), and every gradient
    # the satellite sent reached the core (its exchange: tests/engines/test_trainer_exchange.py)
    assert core.micro_batches_trained + satellite.micro_batches_trained >= 4
    assert satellite.gradients_sent == core.gradients_received and core.gradients_sent == 0
    timeline = read_timeline(run_dir)
    # a switch is done when its cell takes its next role; one still in flight when the last step
    # ends is cancelled with the run (in the timeline as "switching", not counted as done)
    last_role: dict[int, str] = {}
    completed = 0
    for rc in timeline.roles:
        completed += last_role.get(rc.cell) == "switching"
        last_role[rc.cell] = rc.role
    assert completed == runtime.switches_done >= 4
    assert {"rollout", "train", "step", "switch"} <= {iv.kind for iv in timeline.intervals}
