"""The run config: `RunConfig`, one nested Struct per component, and reading it.

Owns `RunConfig`, `config_from_dict` and `load_config`. The components' Structs live in the
modules of their side (`engine`, `runtime`, `training`, `agents`); this module only assembles
them and turns bad input into one `ConfigError` line.
"""

from __future__ import annotations

import os

import msgspec

from gyre.config.agents import ProxyConfig, TaskConfig
from gyre.config.base import Config, load_toml
from gyre.config.cluster import ClusterConfig
from gyre.config.engine import EngineConfig, ModelConfig, TrainerConfig
from gyre.config.gateway import GatewayConfig
from gyre.config.runtime import (
    CellConfig,
    LoopConfig,
    ObserveConfig,
    ReportConfig,
    RouterConfig,
    SchedulerConfig,
)
from gyre.config.training import RLConfig, TrajectoryConfig, WarmStartConfig
from gyre.errors import ConfigError

__all__ = ["RunConfig", "config_from_dict", "load_config"]


class RunConfig(Config):
    """One run of one node. Loaded from TOML with `load_config`; see `examples/`."""

    run_dir: str = "runs/default"
    """Where logs, records, metrics and checkpoints go."""
    seed: int = 0
    model: ModelConfig = ModelConfig()
    engine: EngineConfig = EngineConfig()
    cells: CellConfig = CellConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    router: RouterConfig = RouterConfig()
    trajectory: TrajectoryConfig = TrajectoryConfig()
    rl: RLConfig = RLConfig()
    trainer: TrainerConfig = TrainerConfig()
    loop: LoopConfig = LoopConfig()
    proxy: ProxyConfig = ProxyConfig()
    tasks: TaskConfig = TaskConfig()
    warm_start: WarmStartConfig = WarmStartConfig()
    observe: ObserveConfig = ObserveConfig()
    report: ReportConfig = ReportConfig()
    gateway: GatewayConfig = GatewayConfig()
    cluster: ClusterConfig = ClusterConfig()

    def __post_init__(self) -> None:
        if not self.run_dir:
            raise ValueError(f"run_dir={self.run_dir!r} must not be empty")
        k = self.cells.devices_per_cell
        if k > 1 and self.trainer.zero_stage != 3:  # a cell's k ranks shard only under ZeRO-3
            raise ValueError(
                f"cells.devices_per_cell={k} needs trainer.zero_stage = 3 "
                f"(got {self.trainer.zero_stage})"
            )


def config_from_dict(data: dict) -> RunConfig:
    """Build a `RunConfig` from plain data; raises `ConfigError` naming the key and value."""
    try:
        return msgspec.convert(data, RunConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid config: {exc}") from None


def load_config(path: str | os.PathLike[str]) -> RunConfig:
    """Read a TOML run config. Raises `ConfigError` (one line: file, key path, value)."""
    return load_toml(path, RunConfig)
