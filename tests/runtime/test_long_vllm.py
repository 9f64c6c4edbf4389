"""A long execution on the real engines (issue 16): the tiny model served with a 131072-token
context by a vLLM cell; the scripted long-horizon agent's execution (compactions, sub-agents)
goes proxy -> tree -> select -> pack (DFS chunks) -> one DeepSpeed step -> snapshot -> the cell,
and the cell then samples a prompt past the 32K mark at the new version.

Slow tier: one cell start and a 32K-token execution (about 75 calls, one step): the 128K run (300+
calls, about 7 minutes of this 2-core machine) is `benchmarks/bench_long.py`'s, which runs the same
pieces and writes their numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from benchmarks.bench_long import (
    LONG_CONTEXT,
    agent_settings,
    full_context_call,
    long_engine_config,
    long_model,
    run_execution,
    train_and_sync,
)
from gyre.config import ProxyConfig, RLConfig, TrainerConfig
from tests.conftest import require_vllm

TARGET = 32768
"""The slow test's execution: tokens in its tree (the engine still serves `LONG_CONTEXT`)."""


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


def test_long_model_keeps_the_tiny_models_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    model_dir = long_model(tmp_path)
    config = json.loads((model_dir / "config.json").read_text())
    assert config["max_position_embeddings"] == LONG_CONTEXT == 131072
    base = json.loads((tiny_model_dir / "config.json").read_text())
    assert {k: v for k, v in config.items() if k != "max_position_embeddings"} == {
        k: v for k, v in base.items() if k != "max_position_embeddings"
    }
    long_w = load_file(model_dir / "model.safetensors")
    base_w = load_file(tiny_model_dir / "model.safetensors")
    assert long_w.keys() == base_w.keys()
    assert all(long_w[k].equal(base_w[k]) for k in base_w)


@pytest.mark.slow
@pytest.mark.anyio
async def test_32k_execution_trains_and_syncs_on_a_128k_engine(tmp_path: Path) -> None:
    require_vllm()
    from transformers import AutoTokenizer

    from gyre.cell.spawn import open_cell
    from gyre.engines.trainer import DeepSpeedTrainer
    from gyre.rl import PolicyObjective
    from gyre.tito.proxy import TitoProxy

    model_dir = long_model(tmp_path)
    trainer = await anyio.to_thread.run_sync(
        lambda: DeepSpeedTrainer(
            model_dir, TrainerConfig(learning_rate=1e-4), PolicyObjective(RLConfig())
        )
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    async with open_cell(model_dir, long_engine_config(), log_path=tmp_path / "cell.log") as engine:
        proxy = TitoProxy(tokenizer=tokenizer, engine_for=lambda _e: engine, config=ProxyConfig())
        eid = "long-32k"
        outcome, calls, _ = await run_execution(proxy, eid, agent_settings(TARGET), tmp_path / "x")
        await proxy.close(eid)
        assert outcome.termination == "finished", outcome
        assert outcome.score is not None and outcome.score.score == 1.0
        assert len(calls) >= TARGET * 300 // LONG_CONTEXT  # agent_settings: 300 calls per 128K
        roles = {r: sum(c.role == r for c in calls) for r in ("main", "main_summary", "sub_agent")}
        assert roles["main_summary"] >= 1  # a compaction per ~16K tokens of main context
        assert roles["sub_agent"] == 5 * (roles["main"] // 25)  # 5 calls per 25 main turns
        assert all(c.versions == [0] * len(c.completion_ids) for c in calls)

        step = await train_and_sync(
            trainer, engine, calls, snapshots=tmp_path / "snapshots", micro_batch_tokens=16384
        )
        assert step["tree_tokens"] >= TARGET
        assert step["selected_paths"] == step["leaves"] > roles["main_summary"]
        assert step["packed_tokens"] == step["tree_tokens"]  # every path: the whole tree, once
        assert step["applied"] and step["version"] == 1 == trainer.version
        # the trainer's logprobs of the sampled tokens are vLLM's (float32 on both sides)
        assert step["logprob_abs_diff_mean"] < 1e-4

        full = await full_context_call(engine, calls, TARGET + 8)
        assert full["prompt_tokens"] == TARGET + 8
        assert full["tokens"] >= 1 and full["versions"] == [1] * full["tokens"]  # synced
