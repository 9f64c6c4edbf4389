"""Typed, frozen run configuration, loaded from TOML.

Owns `RunConfig`, `load_config` and `config_from_dict`; the nested Struct per component lives in
the module of its side: `engine` (model, engine, KV transfer, trainer), `runtime` (cells,
scheduler, router, loop, observe, report), `training` (trajectory, RL, warm start), `agents`
(proxy, harness, tasks), `gateway` (external agent loops) and `cluster` (several hosts), all on
`base.Config`. Every field has a unit in its name where it has one and is validated at
construction with `ValueError(f"{field=} ...")`; `load_config` turns unknown keys, wrong types
and bad values into one `ConfigError` line naming the key path
(``$.engine.max_model_len``) and the value. msgspec checks types only when decoding, so a config
built in Python is type-checked by `check_types` (`gyre.run` calls it first). Components receive
their own Struct and know nothing about the file format.
"""

from __future__ import annotations

from gyre.config.agents import HarnessConfig, ProxyConfig, TaskConfig
from gyre.config.base import load_toml
from gyre.config.cluster import ClusterConfig
from gyre.config.engine import EngineConfig, KVTransferConfig, ModelConfig, TrainerConfig
from gyre.config.gateway import GatewayConfig
from gyre.config.run import (
    RESUME_FIXED,
    RunConfig,
    check_types,
    config_from_dict,
    load_config,
    resume_fixed,
)
from gyre.config.runtime import (
    CellConfig,
    LoopConfig,
    ObserveConfig,
    ReportConfig,
    RouterConfig,
    SchedulerConfig,
)
from gyre.config.training import RLConfig, TrajectoryConfig, WarmStartConfig

__all__ = [
    "ModelConfig",
    "KVTransferConfig",
    "EngineConfig",
    "CellConfig",
    "SchedulerConfig",
    "RouterConfig",
    "TrainerConfig",
    "LoopConfig",
    "TrajectoryConfig",
    "RLConfig",
    "ProxyConfig",
    "HarnessConfig",
    "TaskConfig",
    "WarmStartConfig",
    "ObserveConfig",
    "ReportConfig",
    "GatewayConfig",
    "ClusterConfig",
    "RunConfig",
    "load_config",
    "load_toml",
    "config_from_dict",
    "check_types",
    "RESUME_FIXED",
    "resume_fixed",
]
