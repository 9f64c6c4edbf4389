"""Typed, frozen configuration of the cluster simulator (`python -m gyre.sim --config FILE`).

Owns `SimConfig` and its parts: `ClusterConfig` (cells, FLOPs, KV memory), `SimModelConfig` (the
simulated model's size, not gyre's tiny model), `WorkloadConfig` (execution durations and tokens),
`CostConfig` (switch, weight-sync, KV-migration and optimizer costs) and `PolicyConfig` (which
policies to compare and with what knobs). It is the simulator's own tool config, so it lives here
and not in `gyre.config.RunConfig`. Derived quantities (slots per cell, training seconds of one
execution, weight-sync seconds) are methods here so the engine and the tests share one formula.
"""

from __future__ import annotations

import math
import os
from typing import Literal

from gyre.config.base import Config, check_positive, load_toml

__all__ = [
    "ClusterConfig",
    "SimModelConfig",
    "WorkloadConfig",
    "CostConfig",
    "PolicyConfig",
    "SimConfig",
    "load_sim_config",
    "SWITCH_TO_TRAIN_S",
    "SWITCH_TO_ROLLOUT_S",
]

SWITCH_TO_TRAIN_S = 8.52
"""QwenGyre's measured rollout -> train switch (docs/notes/anchors.md §0, §1d)."""
SWITCH_TO_ROLLOUT_S = 3.46
"""QwenGyre's measured train -> rollout switch (docs/notes/anchors.md §0, §1d)."""


class ClusterConfig(Config, frozen=True):
    """C identical cells; each holds one training copy or one inference engine."""

    num_cells: int = 16
    cell_peak_flops_per_s: float = 8 * 989e12
    """Dense BF16 peak of one cell (default: 8 x H200 at 989 TFLOP/s, anchors note §3)."""
    train_mfu: float = 0.25
    """Model FLOPs utilisation of training at long context (fraction of peak)."""
    kv_cache_bytes_per_cell: float = 400e9
    """KV-cache memory of one rollout cell in bytes."""

    def __post_init__(self) -> None:
        check_positive(
            num_cells=self.num_cells,
            cell_peak_flops_per_s=self.cell_peak_flops_per_s,
            kv_cache_bytes_per_cell=self.kv_cache_bytes_per_cell,
        )
        if not 0 < self.train_mfu <= 1:
            raise ValueError(f"train_mfu={self.train_mfu} must be in (0, 1]")


class SimModelConfig(Config, frozen=True):
    """Size of the simulated policy model (only what the cost formulas need)."""

    active_params: float = 10e9
    """Parameters touched per token (all of them for a dense model)."""
    total_params: float = 122e9
    """All parameters (sets weight-sync bytes)."""
    bytes_per_param: float = 2.0
    """Bytes of one parameter as synced to rollout cells (2 = BF16, 1 = FP8)."""
    num_layers: int = 48
    """Layers with full causal attention (hybrid models: only those)."""
    attention_width: int = 4096
    """Query heads x head dimension of one attention layer."""
    kv_bytes_per_token: float = 49152.0
    """KV-cache bytes one token takes on a rollout cell (all layers, K and V)."""

    def __post_init__(self) -> None:
        check_positive(
            active_params=self.active_params,
            total_params=self.total_params,
            bytes_per_param=self.bytes_per_param,
            num_layers=self.num_layers,
            attention_width=self.attention_width,
            kv_bytes_per_token=self.kv_bytes_per_token,
        )
        if self.active_params > self.total_params:
            raise ValueError(
                f"active_params={self.active_params} must be <= total_params={self.total_params}"
            )


class WorkloadConfig(Config, frozen=True):
    """Executions: lognormal wall durations with a timeout cap, tokens from tool and decode rates.

    Duration ``d = min(median_duration_s * exp(sigma * Z), timeout_s)`` with ``Z ~ N(0, 1)``; an
    execution cut at the timeout is partially scored and trained like any other. Its context
    ``tokens = min(max_context_tokens, prompt_tokens + d * (decode_fraction * decode_tokens_per_s
    + (1 - decode_fraction) * tool_tokens_per_s))``.
    """

    num_steps: int = 48
    batch_executions: int = 128
    """Executions per optimizer step."""
    group_size: int = 8
    """Executions of one task per step; a group is trainable once all its members finished."""
    median_duration_s: float = 3600.0
    sigma: float = 1.0
    """Lognormal shape of the duration; 0 gives every execution the median."""
    timeout_s: float = 8 * 3600.0
    """Deadline of one execution (the cap of the distribution)."""
    decode_fraction: float = 0.4
    """Share of an execution's wall time spent decoding on its cell; the rest is tool time."""
    decode_tokens_per_s: float = 60.0
    """Tokens one execution decodes per second while decoding."""
    tool_tokens_per_s: float = 45.0
    """Tool-output tokens added to the context per second of tool time."""
    prompt_tokens: int = 19_000
    """Initial prompt (task spec) tokens."""
    max_context_tokens: int = 1_000_000
    """Context cap (compaction keeps an execution under it); also the KV reserved per execution."""
    seed: int = 0

    def __post_init__(self) -> None:
        check_positive(
            num_steps=self.num_steps,
            batch_executions=self.batch_executions,
            group_size=self.group_size,
            median_duration_s=self.median_duration_s,
            timeout_s=self.timeout_s,
            max_context_tokens=self.max_context_tokens,
        )
        if self.sigma < 0:
            raise ValueError(f"sigma={self.sigma} must be >= 0")
        if self.batch_executions % self.group_size:
            raise ValueError(
                f"batch_executions={self.batch_executions} must be a multiple of "
                f"group_size={self.group_size}"
            )
        if not 0 <= self.decode_fraction <= 1:
            raise ValueError(f"decode_fraction={self.decode_fraction} must be in [0, 1]")
        if self.decode_tokens_per_s < 0 or self.tool_tokens_per_s < 0 or self.prompt_tokens < 0:
            raise ValueError(
                f"decode_tokens_per_s={self.decode_tokens_per_s}, "
                f"tool_tokens_per_s={self.tool_tokens_per_s}, "
                f"prompt_tokens={self.prompt_tokens} must be >= 0"
            )

    def tokens(self, duration_s: float) -> float:
        """Context tokens an execution of `duration_s` ends with (formula in the class doc)."""
        rate = (
            self.decode_fraction * self.decode_tokens_per_s
            + (1 - self.decode_fraction) * self.tool_tokens_per_s
        )
        return min(float(self.max_context_tokens), self.prompt_tokens + duration_s * rate)


class CostConfig(Config, frozen=True):
    """Overheads of the elastic mechanics, in seconds or bytes per second."""

    switch_to_train_s: float = SWITCH_TO_TRAIN_S
    """Rollout -> train, including loading the core's weight snapshot (published 8.52 s)."""
    switch_to_rollout_s: float = SWITCH_TO_ROLLOUT_S
    """Train -> rollout, including waking the engine with the newest weights (published 3.46 s)."""
    weight_sync_bytes_per_s: float = 100e9
    """Trainer -> rollout-cell weight bandwidth; sync time = weight bytes / this
    (docs/notes/anchors.md §3)."""
    kv_migration_bytes_per_s: float = 87e9
    """KV bandwidth when an execution moves off a cell leaving rollout (Mooncake 4x200 Gb/s)."""
    optimizer_step_s: float = 30.0
    """Gradient reduction on the core plus the optimizer update, per step."""

    def __post_init__(self) -> None:
        for name in ("switch_to_train_s", "switch_to_rollout_s", "optimizer_step_s"):
            value = getattr(self, name)
            if not value >= 0:  # math.inf is allowed: "never worth switching"
                raise ValueError(f"{name}={value!r} must be >= 0")
        check_positive(
            weight_sync_bytes_per_s=self.weight_sync_bytes_per_s,
            kv_migration_bytes_per_s=self.kv_migration_bytes_per_s,
        )


class PolicyConfig(Config, frozen=True):
    """Which policies to compare and their knobs.

    A step's batch is formed one of three ways. Streaming: the first
    ``batch_executions // group_size`` groups to finish, each trainable as soon as it finishes.
    Not streaming, `unstreamed_batch = "first_finished"`: the same groups, trainable once the
    batch is full (AReaL's buffer, the published Async baseline). Not streaming, `"dispatched"`:
    the groups dispatched for the step, trainable once all of them finished (the node runtime's
    `scheduler.streaming = false`). In the first two, groups finishing after the batch is full
    carry over to the next step; for Colocate that needs ``colocate_max_staleness_steps >= 1``.
    """

    colocate_streaming: bool = False
    """Streaming for Colocate (see the class doc). The published baselines do not stream."""
    async_streaming: bool = False
    """Streaming for Async (see the class doc)."""
    elastic_streaming: bool = True
    """Streaming for Elastic (QwenGyre streams; see the class doc)."""
    unstreamed_batch: Literal["first_finished", "dispatched"] = "first_finished"
    """How a policy that does not stream forms its batch (see the class doc)."""
    async_num_train_cells: int = 0
    """Training cells of the fixed Async split; 0 searches every split and keeps the fastest."""
    colocate_max_staleness_steps: int = 0
    """0: verl's on-policy colocation, a step's batch is exactly its own executions. k >= 1:
    partial rollouts, freed slots take later steps' executions and those still running at the
    switch to training are suspended and resume in the next rollout phase (`ColocatePolicy`)."""
    async_max_staleness_steps: int = 1
    elastic_max_staleness_steps: int = 1
    compare: tuple[str, ...] = ("colocate", "async", "elastic")

    def __post_init__(self) -> None:
        if self.async_num_train_cells < 0:
            raise ValueError(f"async_num_train_cells={self.async_num_train_cells} must be >= 0")
        if (
            min(
                self.colocate_max_staleness_steps,
                self.async_max_staleness_steps,
                self.elastic_max_staleness_steps,
            )
            < 0
        ):
            raise ValueError(
                f"colocate_max_staleness_steps={self.colocate_max_staleness_steps}, "
                f"async_max_staleness_steps={self.async_max_staleness_steps}, "
                f"elastic_max_staleness_steps={self.elastic_max_staleness_steps} must be >= 0"
            )
        if self.colocate_streaming and self.colocate_max_staleness_steps == 0:
            raise ValueError(
                f"colocate_streaming={self.colocate_streaming} with "
                f"colocate_max_staleness_steps={self.colocate_max_staleness_steps}: an on-policy "
                "Colocate step dispatches exactly its batch, so streaming changes nothing; set "
                "colocate_max_staleness_steps >= 1 (partial rollouts)"
            )
        if len(set(self.compare)) != len(self.compare):
            raise ValueError(f"compare={self.compare!r} names a policy twice")
        unknown = set(self.compare) - {"colocate", "async", "elastic"}
        if unknown or not self.compare:
            raise ValueError(f"compare={self.compare!r} must name some of colocate, async, elastic")

    def streaming(self, policy: str) -> bool:
        """Whether `policy` (colocate, async or elastic) streams."""
        flags = {
            "colocate": self.colocate_streaming,
            "async": self.async_streaming,
            "elastic": self.elastic_streaming,
        }
        if policy not in flags:
            raise ValueError(f"{policy=} must be colocate, async or elastic")
        return flags[policy]


class SimConfig(Config, frozen=True):
    """One simulated scenario."""

    name: str = "sim"
    out_dir: str = "runs/sim"
    """Where `python -m gyre.sim` writes the timeline PNGs."""
    cluster: ClusterConfig = ClusterConfig()
    model: SimModelConfig = SimModelConfig()
    workload: WorkloadConfig = WorkloadConfig()
    costs: CostConfig = CostConfig()
    policies: PolicyConfig = PolicyConfig()

    def __post_init__(self) -> None:
        if self.capacity_per_cell() < 1:
            raise ValueError(
                f"kv_cache_bytes_per_cell={self.cluster.kv_cache_bytes_per_cell} "
                "holds no execution of "
                f"max_context_tokens={self.workload.max_context_tokens} at "
                f"kv_bytes_per_token={self.model.kv_bytes_per_token}"
            )
        if self.policies.async_num_train_cells >= self.cluster.num_cells:
            raise ValueError(
                f"async_num_train_cells={self.policies.async_num_train_cells} must be < "
                f"num_cells={self.cluster.num_cells}"
            )

    def capacity_per_cell(self) -> int:
        """Concurrent executions per rollout cell: KV memory / (KV per token x context cap)."""
        reserved = self.model.kv_bytes_per_token * self.workload.max_context_tokens
        return math.floor(self.cluster.kv_cache_bytes_per_cell / reserved)

    def train_flops(self, tokens: float) -> float:
        """Training FLOPs of one execution of `tokens` context tokens.

        ``6 * active_params * T`` (matmuls: 2 forward + 4 backward per parameter and token) plus
        ``6 * num_layers * attention_width * T**2`` (causal attention; anchors note §3).
        """
        m = self.model
        return (
            6.0 * m.active_params * tokens
            + 6.0 * m.num_layers * m.attention_width * tokens * tokens
        )

    def train_s(self, tokens: float) -> float:
        """Seconds one cell takes to train one execution: FLOPs / (peak x MFU)."""
        return self.train_flops(tokens) / (
            self.cluster.cell_peak_flops_per_s * self.cluster.train_mfu
        )

    def weight_sync_s(self) -> float:
        """Seconds to move one weight version to a cell: total_params x bytes / bandwidth."""
        return (
            self.model.total_params
            * self.model.bytes_per_param
            / self.costs.weight_sync_bytes_per_s
        )

    def migration_s(self, tokens: float) -> float:
        """Seconds to move the KV of `tokens` tokens to another cell."""
        return tokens * self.model.kv_bytes_per_token / self.costs.kv_migration_bytes_per_s


def load_sim_config(path: str | os.PathLike[str]) -> SimConfig:
    """Read a simulator TOML. Raises `ConfigError` (one line: file, key path, value)."""
    return load_toml(path, SimConfig)
