"""Simulator config: shipped files load, bad keys and values are refused, formulas by hand."""

from __future__ import annotations

import math

import msgspec
import pytest

from gyre.errors import ConfigError
from gyre.sim.config import (
    SWITCH_TO_ROLLOUT_S,
    SWITCH_TO_TRAIN_S,
    SimConfig,
    WorkloadConfig,
    load_sim_config,
)
from tests.sim.conftest import EXAMPLES


@pytest.mark.parametrize("name", ["122b-longtail.toml", "2.4t-capped.toml"])
def test_shipped_configs_load(name: str) -> None:
    config = load_sim_config(EXAMPLES / name)
    assert config.capacity_per_cell() == 8
    assert config.workload.batch_executions == config.cluster.num_cells * config.capacity_per_cell()
    assert config.costs.switch_to_train_s == SWITCH_TO_TRAIN_S == 8.52
    assert config.costs.switch_to_rollout_s == SWITCH_TO_ROLLOUT_S == 3.46


def test_unknown_key_is_refused(tmp_path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[workload]\nmedian_duration = 10\n")
    with pytest.raises(ConfigError, match="median_duration"):
        load_sim_config(path)


def test_bad_values_name_the_field() -> None:
    with pytest.raises(ValueError, match="group_size=3"):
        WorkloadConfig(batch_executions=8, group_size=3)
    with pytest.raises(ValueError, match="sigma=-1"):
        WorkloadConfig(sigma=-1.0)
    with pytest.raises(ValueError, match="holds no execution"):
        msgspec.convert({"cluster": {"kv_cache_bytes_per_cell": 1.0}}, SimConfig)
    with pytest.raises(msgspec.ValidationError, match="names a policy twice"):
        msgspec.convert({"policies": {"compare": ["async", "async"]}}, SimConfig)
    with pytest.raises(msgspec.ValidationError, match="colocate_max_staleness_steps=0"):
        msgspec.convert({"policies": {"colocate_streaming": True}}, SimConfig)
    with pytest.raises(msgspec.ValidationError, match="unstreamed_batch"):
        msgspec.convert({"policies": {"unstreamed_batch": "whole"}}, SimConfig)


def test_cost_formulas_by_hand(tiny: SimConfig) -> None:
    assert tiny.capacity_per_cell() == 2  # 2000 bytes / (1 byte x 1000 tokens)
    assert tiny.train_flops(1000) == 6 * 1e9 * 1000 + 6 * 1 * 1000 * 1000**2 == 6.006e12
    assert tiny.train_s(1000) == pytest.approx(6.006)
    assert tiny.weight_sync_s() == pytest.approx(10.0)
    assert tiny.migration_s(500) == pytest.approx(500 / 87e9)


def test_tokens_grow_with_duration_and_stop_at_the_context_cap() -> None:
    w = WorkloadConfig(
        decode_fraction=0.5,
        decode_tokens_per_s=100.0,
        tool_tokens_per_s=20.0,
        prompt_tokens=1000,
        max_context_tokens=100_000,
    )
    assert w.tokens(0.0) == 1000
    assert w.tokens(100.0) == 1000 + 100 * (0.5 * 100 + 0.5 * 20) == 7000
    assert w.tokens(1e9) == 100_000


def test_attention_term_dominates_at_long_context() -> None:
    # docs/notes/anchors.md §3: 7B dense, 32 layers, d = 4096, L = 32K: attention share 38%.
    c = msgspec.convert(
        {
            "model": {
                "active_params": 7e9,
                "total_params": 7e9,
                "num_layers": 32,
                "attention_width": 4096,
            }
        },
        SimConfig,
    )
    L = 32768
    share = 6 * 32 * 4096 * L * L / c.train_flops(L)
    assert share == pytest.approx(0.38, abs=0.01)
    assert math.isclose(c.train_flops(L) / L, 6 * 7e9 + 6 * 32 * 4096 * L)
