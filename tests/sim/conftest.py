"""Small simulator scenarios shared by the tests (hand-checkable sizes)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from gyre.sim.config import SimConfig, load_sim_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "sim"


def replace(config: SimConfig, **fields: object) -> SimConfig:
    """Copy of `config` with ``section__field=value`` overrides (validation runs again)."""
    parts: dict[str, dict[str, object]] = {}
    for key, value in fields.items():
        section, name = key.split("__")
        parts.setdefault(section, {})[name] = value
    data = msgspec.to_builtins(config)
    for section, values in parts.items():
        data[section].update(values)
    return msgspec.convert(data, SimConfig)


@pytest.fixture(scope="session")
def longtail() -> SimConfig:
    """The shipped 122B-like workload shrunk to 8 cells, one batch of 64, 24 steps."""
    config = load_sim_config(EXAMPLES / "122b-longtail.toml")
    return replace(
        config, cluster__num_cells=8, workload__batch_executions=64, workload__num_steps=24
    )


@pytest.fixture
def tiny() -> SimConfig:
    """2 cells x 2 slots, batch 4 in groups of 2, every execution 100 s and 6.006 s of training.

    train FLOPs = 6 * 1e9 * 1000 + 6 * 1 * 1000 * 1000**2 = 6.006e12 at 1e12 FLOP/s and MFU 1;
    weight sync = 1e9 params x 1 byte / 1e8 B/s = 10 s; optimizer step 5 s.
    """
    return msgspec.convert(
        {
            "name": "tiny",
            "cluster": {
                "num_cells": 2,
                "cell_peak_flops_per_s": 1e12,
                "train_mfu": 1.0,
                "kv_cache_bytes_per_cell": 2000,
            },
            "model": {
                "active_params": 1e9,
                "total_params": 1e9,
                "bytes_per_param": 1.0,
                "num_layers": 1,
                "attention_width": 1000,
                "kv_bytes_per_token": 1.0,
            },
            "workload": {
                "num_steps": 2,
                "batch_executions": 4,
                "group_size": 2,
                "median_duration_s": 100.0,
                "sigma": 0.0,
                "timeout_s": 1000.0,
                "decode_tokens_per_s": 0.0,
                "tool_tokens_per_s": 0.0,
                "prompt_tokens": 1000,
                "max_context_tokens": 1000,
            },
            "costs": {"weight_sync_bytes_per_s": 1e8, "optimizer_step_s": 5.0},
            "policies": {"async_max_staleness_steps": 0},
        },
        SimConfig,
    )
