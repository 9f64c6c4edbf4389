"""The elastic runtime on real cells: two cell processes, each a vLLM engine and a DeepSpeed
trainer, one gloo gradient group, the colocate policy (so both cells roll out, both train, and the
satellite's gradient goes to the core every step), two steps of the coin agent.

Invariants: every step trains one whole batch and publishes it (versions 1, 2 on every engine,
snapshots written), the trainer's logprobs match vLLM's behaviour logprobs after each sync (fp32,
< 1e-4), the satellite's gradients reached the core (gradient traffic counted on both cells),
every role switch is in the timeline.
"""

from __future__ import annotations

import gc
from pathlib import Path

import anyio
import pytest
import torch
from transformers import AutoTokenizer

from gyre.cell.spawn import open_cells
from gyre.config import config_from_dict
from gyre.rollout.tasks import split_tasks
from gyre.runtime.cell_handle import CellHandle
from gyre.runtime.elastic_job import run_cells
from gyre.runtime.metrics import EvalMetrics, StepMetrics, read_metrics
from gyre.runtime.timeline import read_timeline
from gyre.tito.log import read_log
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
    assert runtime.statistics().weight_version == 2
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
    assert completed == runtime.statistics().switches >= 4
    assert {"rollout", "train", "step", "switch"} <= {iv.kind for iv in timeline.intervals}


def one_cell_config(run_dir: Path, model_dir: Path) -> dict:
    return {
        "run_dir": str(run_dir),
        "seed": 3,
        "model": {"path": str(model_dir), "init_if_missing": False},
        "engine": {"max_model_len": 1024, "kv_cache_memory_bytes": 64 * 2**20},
        "loop": {
            "steps": 2,
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
        "report": {"sinks": ["tensorboard"]},
    }


def test_one_real_cell_keeps_the_invariants_of_the_old_loop(tmp_path, tiny_model_dir) -> None:
    """One cell (the `auto` policy: colocate) on the real engines, 2 steps of the coin agent with
    held-out evaluations before and after: the trained tokens are exactly the sampled ones (each
    call extends the previous one: one path per execution), every training call of step s was
    sampled at version s - 1 and the last evaluation at version 2 (the engine was bumped), the
    trainer's logprobs match vLLM's (< 1e-4 on same-version tokens), the weights changed, and
    TensorBoard holds the runtime's statistics per step."""
    require_vllm()
    pytest.importorskip("deepspeed")
    from gyre.runtime.elastic_job import run_elastic
    from tests.runtime.test_sinks import read_tensorboard

    config = config_from_dict(one_cell_config(tmp_path / "run", tiny_model_dir))
    run_dir = Path(config.run_dir)
    runtime = anyio.run(run_elastic, config, tiny_model_dir, backend="trio")
    assert runtime.policy.name == "colocate" and runtime.statistics().weight_version == 2

    records = read_metrics(run_dir)
    steps = [r for r in records if isinstance(r, StepMetrics)]
    evals = [r for r in records if isinstance(r, EvalMetrics)]
    assert [(s.step, s.version) for s in steps] == [(1, 1), (2, 2)]
    assert [(e.step, e.version, e.executions) for e in evals] == [(0, 0, 2), (2, 2, 2)]
    log = read_log(run_dir / config.proxy.log_name)
    training = [e for e in log.summaries if e.startswith("x")]
    assert len(training) >= 8
    for record in steps:
        # the executions sampled at version step - 1 are this step's batch (colocate, on-policy)
        batch = [
            e
            for e in training
            if {v for c in log.for_execution(e) for v in c.versions} == {record.step - 1}
        ]
        assert len(batch) == record.executions == 4
        calls = [c for e in batch for c in log.for_execution(e)]
        assert record.policy_tokens == sum(len(c.completion_ids) for c in calls) > 0
        assert record.applied and record.failed == 0
        assert record.grad_norm > 0  # DeepSpeed's global norm of the step, reported
        assert record.same_version_mismatch_mean < 1e-4
        assert record.logprob_abs_diff_mean < 1e-4
    final = [e for e in log.summaries if e.startswith("eval2-")]
    assert len(final) == 2
    assert {v for e in final for c in log.for_execution(e) for v in c.versions} == {2}

    from transformers import AutoModelForCausalLM

    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(run_dir / "snapshots" / "v2").state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)

    board = read_tensorboard(run_dir / "tensorboard")
    assert board["stats/weights/version"] == {1: 1.0, 2: 2.0}
    assert board["stats/runtime/steps_done"] == {1: 1.0, 2: 2.0}
    assert board["stats/runtime/suspensions"] == {1: 0.0, 2: 0.0}
    assert board["eval/heldout/pass_rate"] == {0: evals[0].pass_rate, 2: evals[1].pass_rate}


def test_the_documented_elastic_config_shrunk_runs_the_elastic_policy(
    tmp_path, tiny_model_dir
) -> None:
    """`examples/elastic-cpu.toml` as documented (2 cells, the elastic policy, the reference
    agent, its suite), shrunk: 2 steps of 4 executions, 2 held-out tasks, no warm start. It runs
    through `gyre.job.run` (what `python -m gyre.node --config` does): both steps publish, the
    held-out evaluations run before and after, and the policy moved cells between roles."""
    require_vllm()
    pytest.importorskip("deepspeed")
    import msgspec

    from gyre.config import load_config
    from gyre.job import run

    documented = load_config(REPO / "examples/elastic-cpu.toml")
    assert (documented.cells.num_cells, documented.scheduler.policy) == (2, "elastic")
    data = msgspec.to_builtins(documented)
    data["run_dir"] = str(tmp_path / "run")
    data["model"].update(path=str(tiny_model_dir), init_if_missing=False)
    data["warm_start"]["enabled"] = False
    data["tasks"]["suites"] = [str(REPO / suite) for suite in data["tasks"]["suites"]]
    data["loop"].update(steps=2, batch_executions=4, group_size=2, heldout_tasks=2)
    data["loop"].update(eval_group_size=1)
    data["scheduler"]["capacity_per_cell"] = 2
    config = config_from_dict(data)
    state = run(config)
    assert (state.step, state.version) == (2, 2)
    assert gc.get_freeze_count() == 0  # the node froze its start-up heap and thawed it at the end
    run_dir = tmp_path / "run"
    records = read_metrics(run_dir)
    steps = [r for r in records if isinstance(r, StepMetrics)]
    assert [(s.step, s.version, s.executions, s.applied) for s in steps] == [
        (1, 1, 4, True),
        (2, 2, 4, True),
    ]
    assert [r.step for r in records if isinstance(r, EvalMetrics)] == [0, 2]
    roles = read_timeline(run_dir).roles
    assert {rc.role for rc in roles} >= {"switching", "train", "rollout"}
    assert (run_dir / "report").exists()
