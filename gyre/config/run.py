"""The run config: `RunConfig`, one nested Struct per component, and reading it.

Owns `RunConfig`, `config_from_dict`, `load_config`, `check_types` (a config built in Python
type-checked), and `RESUME_FIXED` with `resume_fixed` (the settings a `--resume` must keep). The
components' Structs live in the modules of their side (`engine`, `runtime`, `training`,
`agents`); this module only assembles them and turns bad input into one `ConfigError` line.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec

from gyre.config.agents import ProxyConfig, TaskConfig
from gyre.config.base import Config, load_toml, validation_message
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

__all__ = [
    "RESUME_FIXED",
    "RunConfig",
    "check_types",
    "config_from_dict",
    "load_config",
    "resume_fixed",
]


class RunConfig(Config, frozen=True):
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
        raise ConfigError(f"invalid config: {validation_message(exc, RunConfig)}") from None


def check_types(config: RunConfig) -> None:
    """Raise `ConfigError` when a `RunConfig` built in Python holds a value of the wrong type:
    the key path with the expected and given type (`RLConfig(stop_penalty=True)`), or the type
    that is no config value at all (a `Path`). msgspec checks types only when it decodes, so this
    checks a built config as `load_config` checks a file. Anything but a `RunConfig` (a path, a
    dict) is refused, pointing at `load_config`."""
    if not isinstance(config, RunConfig):
        raise ConfigError(
            f"invalid config: a RunConfig is needed, not {type(config).__name__} "
            "(gyre.load_config(path) reads a TOML file)"
        )
    try:
        data = msgspec.to_builtins(config)
    except TypeError as exc:
        raise ConfigError(
            f"invalid config: {exc} (a config holds str, int, float, bool, lists and tables)"
        ) from None
    config_from_dict(data)


def load_config(path: str | os.PathLike[str]) -> RunConfig:
    """Read a TOML run config. Raises `ConfigError` (one line: file, key path, value)."""
    return load_toml(path, RunConfig)


RESUME_FIXED = (
    "seed",
    "loop.batch_executions",
    "loop.group_size",
    "rl.clip_eps",
    "rl.is_cap",
    "rl.max_staleness",
    "rl.stop_penalty",
    "trajectory.jmax",
    "trajectory.role_limits",
    "trainer.zero_stage",
    "trainer.learning_rate",
    "trainer.warmup_steps",
    "trainer.weight_decay",
    "trainer.grad_clip",
    "trainer.adam_beta1",
    "trainer.adam_beta2",
    "trainer.adam_eps",
    "trainer.dtype",
)
"""The settings that decide which data a run trains on and the loss and update it trains with
(and `trainer.zero_stage`, whose DeepSpeed checkpoint does not load at another stage). A
`--resume` must keep them: a run that changed one halfway would be neither run, and nothing in
its metrics would say so. The tasks (`tasks.suites`, `loop.heldout_tasks`) are compared by the
split they give (`gyre.rollout.tasks.split_digest`), not by how the paths are written.
Every other setting may change on a resume: `loop.steps` (to extend a run), evaluation, cells
and scheduling (another `cells.devices_per_cell` converts the core's checkpoint:
`gyre.runtime.trainer_checkpoint`), engine memory, micro-batch and chunk sizes (the same loss in
other pieces), reporting."""


def resume_fixed(config: RunConfig) -> dict[str, Any]:
    """`RESUME_FIXED`'s settings of `config`, as plain JSON data keyed by their dotted path
    (`{"rl.stop_penalty": 0.5, ...}`)."""
    data = msgspec.json.decode(msgspec.json.encode(config))
    out: dict[str, Any] = {}
    for key in RESUME_FIXED:
        value = data
        for part in key.split("."):
            value = value[part]
        out[key] = value
    return out
