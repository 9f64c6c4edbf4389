"""Configs of the node runtime: cells, the scheduler policy, the router, the loop, watching a run.

Owns `CellConfig`, `SchedulerConfig`, `RouterConfig`, `LoopConfig`, `ObserveConfig` (the live
run page) and `ReportConfig` (metric sinks). Knows nothing about the engines' own settings
(`gyre.config.engine`) or the file format.
"""

from __future__ import annotations

from typing import Literal

from gyre.config.base import Config, check_positive
from gyre.errors import ConfigError

__all__ = [
    "CellConfig",
    "SchedulerConfig",
    "RouterConfig",
    "LoopConfig",
    "ObserveConfig",
    "ReportConfig",
]


class CellConfig(Config, frozen=True):
    """Cell worker processes on this node."""

    num_cells: int = 1
    host: str = "127.0.0.1"
    """Address the cells' token-level API binds to (loopback unless the node spans hosts)."""
    base_port: int = 0
    """First port for cell APIs; 0 picks free ports."""
    devices_per_cell: int = 1
    """k: devices (ranks) per cell. A cell of k > 1 is k processes: its trainer one DeepSpeed
    ZeRO-3 group over them (`trainer.zero_stage = 3`), its engine vLLM tensor-parallel over them
    on GPU; on CPU, k gloo ranks (`gyre.cell.ranks`)."""

    def __post_init__(self) -> None:
        check_positive(num_cells=self.num_cells, devices_per_cell=self.devices_per_cell)
        if not 0 <= self.base_port < 65536:
            raise ValueError(f"base_port={self.base_port} must be in [0, 65535]")


class SchedulerConfig(Config, frozen=True):
    """Which cells roll out and which train (`gyre.runtime.scheduler`, driven by
    `gyre.runtime.elastic`, the one RL driver for every cell count)."""

    policy: Literal["auto", "colocate", "async", "elastic"] = "auto"
    """`colocate`: every cell rolls out, then every cell trains (one cell: it switches between
    rollout and training inside its process); `async`: a fixed split of `async_train_cells`
    training cells; `elastic`: cells move between roles by the water level; `auto` (default):
    `colocate` when the run has one cell in all, `elastic` with more (`policy_for`)."""
    capacity_per_cell: int = 4
    """Concurrent executions one rollout cell hosts (bounded by its KV memory)."""
    async_train_cells: int = 1
    """Training cells of the `async` split (and of `elastic`'s pinned fallback)."""
    max_staleness_steps: int = 1
    """Versions an execution may start ahead of the step that trains it (AReaL's admission rule),
    for `async` and `elastic`; `colocate` has its own key."""
    colocate_max_staleness_steps: int = 0
    """`colocate`'s staleness bound. 0 (default, verl): a step rolls out exactly its own batch and
    waits for its slowest execution. k > 0 (partial rollouts, Kimi k1.5): freed slots take
    executions of later steps, and the executions still running when every cell switches to
    training are suspended through the training phase and resume after it
    (`gyre.runtime.suspension`)."""
    streaming: bool = True
    """A step's batch is the first `batch_executions // group_size` groups to finish, trained group
    by group as they finish; off: the batch is the step's own dispatched groups, trained once all
    of them are in."""

    def __post_init__(self) -> None:
        check_positive(
            capacity_per_cell=self.capacity_per_cell, async_train_cells=self.async_train_cells
        )
        for key in ("max_staleness_steps", "colocate_max_staleness_steps"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key}={getattr(self, key)} must be >= 0")

    def policy_for(self, num_cells: int) -> Literal["colocate", "async", "elastic"]:
        """The policy a run of `num_cells` cells in all (every host's) drives: `policy`, with
        `auto` resolved (`colocate` for one cell, `elastic` for more). Raises `ConfigError`
        naming the key when `num_cells < 1`, or `async` on one cell (a fixed split needs a
        rollout cell besides its `async_train_cells` training cells)."""
        if num_cells < 1:
            raise ConfigError(f"cells.num_cells: {num_cells} cells in all, need at least 1")
        if self.policy == "auto":
            return "colocate" if num_cells == 1 else "elastic"
        if self.policy == "async" and self.async_train_cells >= num_cells:
            raise ConfigError(
                f"scheduler.async_train_cells={self.async_train_cells} with "
                f"scheduler.policy='async' leaves no rollout cell of {num_cells} cells"
            )
        return self.policy


class RouterConfig(Config, frozen=True):
    """The router in front of the rollout cells (`gyre.routing.router`): every wait it makes is
    bounded."""

    attempt_timeout_s: float = 300.0
    """Longest wait for the next token of one attempt on one cell (the first token includes the
    prefill); a stalled attempt is aborted on its cell and continued elsewhere."""
    abort_timeout_s: float = 30.0
    """Longest wait for a cell to answer an abort and end the aborted stream."""
    no_cell_timeout_s: float = 120.0
    """Longest wait for a rollout cell in service when there is none."""
    request_timeout_s: float = 3600.0
    """Longest time for one request through the router, all attempts and waits included."""
    max_retries: int = 3
    """Failed attempts (timeouts, errors) per choice before its error is raised; redirects off a
    cell that left rollout or went down are not counted."""
    remember_finished: int = 1024
    """Finished request IDs whose completions are kept (msgpack, ~15 bytes per token), so a
    repeated request ID replays them instead of generating again."""

    def __post_init__(self) -> None:
        check_positive(
            attempt_timeout_s=self.attempt_timeout_s,
            abort_timeout_s=self.abort_timeout_s,
            no_cell_timeout_s=self.no_cell_timeout_s,
            request_timeout_s=self.request_timeout_s,
        )
        if self.max_retries < 0:
            raise ValueError(f"max_retries={self.max_retries} must be >= 0")
        if self.remember_finished < 0:
            raise ValueError(f"remember_finished={self.remember_finished} must be >= 0")


class LoopConfig(Config, frozen=True):
    """The RL run (`gyre.runtime.elastic`): steps, batches, groups, held-out evaluation."""

    steps: int = 8
    """Optimizer steps to run (a resumed run continues to this total)."""
    batch_executions: int = 16
    """Executions per step; `batch_executions / group_size` tasks per step."""
    group_size: int = 8
    """Executions of one task per step; their rewards form the baseline."""
    heldout_tasks: int = 8
    """N tasks of the suites (a fixed seeded draw) are never trained on; they are evaluated."""
    eval_group_size: int = 2
    """Executions per held-out task in an evaluation."""
    eval_every: int = 0
    """Evaluate every N steps (0: only before the first and after the last step). Each
    evaluation runs on rollout cells at one published weight version: no step publishes while
    its executions run."""
    max_concurrent_executions: int = 8
    """Agent processes running at once, training and evaluation executions together; an execution
    the policy placed beyond it waits for a free one (keep it at least
    `scheduler.capacity_per_cell` x the run's cells to use every rollout slot)."""
    keep_checkpoints: int = 2
    """Step checkpoints kept on disk (weights, optimizer, loop state)."""
    max_consecutive_failures: int = 16
    """Stop the run with an `ExecutionError` naming the last reason when this many executions in a
    row failed, of two tasks or more (an agent that cannot start, a verifier that cannot run, no
    gateway loop claiming any): such a run would otherwise skip every step for want of anything to
    train on. One broken task, whose whole group fails together, never stops it. Training and
    evaluation executions count alike (the first evaluation runs first). 0: never stop. A resumed
    run re-runs the executions in flight at the stop (`gyre.rollout.source.FailureStreak`)."""

    def __post_init__(self) -> None:
        if self.max_consecutive_failures < 0:
            raise ValueError(
                f"max_consecutive_failures={self.max_consecutive_failures} must be >= 0"
            )
        check_positive(
            steps=self.steps,
            batch_executions=self.batch_executions,
            group_size=self.group_size,
            eval_group_size=self.eval_group_size,
            max_concurrent_executions=self.max_concurrent_executions,
            keep_checkpoints=self.keep_checkpoints,
        )
        if self.batch_executions % self.group_size:
            raise ValueError(
                f"batch_executions={self.batch_executions} must be a multiple of "
                f"group_size={self.group_size}"
            )
        if self.heldout_tasks < 0 or self.eval_every < 0:
            raise ValueError(
                f"heldout_tasks={self.heldout_tasks} and eval_every={self.eval_every} must be >= 0"
            )


class ObserveConfig(Config, frozen=True):
    """The live run page (`gyre.report.live`): read-only, behind the run's secret."""

    page: bool = False
    """Serve the live run page from the node; off: no port is opened."""
    host: str = "127.0.0.1"
    """Address the page binds to (loopback by default: only this machine can reach it)."""
    port: int = 0
    """TCP port; 0 picks a free one (the node prints the page's one-time login URL)."""
    poll_interval_s: float = 1.0
    """How often an open page asks for new records, seconds."""

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError(f"host={self.host!r} must not be empty")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port={self.port} must be in [0, 65535]")
        check_positive(poll_interval_s=self.poll_interval_s)


class ReportConfig(Config, frozen=True):
    """Where a run's metrics go besides `metrics.jsonl` (`gyre.runtime.sinks`).

    Every step and evaluation record, and the runtime's `statistics()` records at each step, are
    streamed to each sink as they are written."""

    sinks: tuple[Literal["tensorboard", "wandb"], ...] = ()
    """`tensorboard`: an event file under `<run_dir>/tensorboard/` (the `tensorboard` package's
    writer, through `torch.utils.tensorboard`); `wandb`: a Weights & Biases run under
    `<run_dir>/wandb/` (needs the `wandb` package, `pip install gyre[wandb]`). A configured sink
    whose package is missing stops the run before it starts."""
    wandb_mode: Literal["auto", "online", "offline"] = "auto"
    """`auto`: `$WANDB_MODE` when set, else online when `$WANDB_API_KEY` is set, else offline
    (the run is written to disk; `wandb sync <run_dir>/wandb/wandb/offline-run-*` uploads it)."""
    wandb_project: str = "gyre"
    """W&B project the run belongs to."""

    def __post_init__(self) -> None:
        if len(set(self.sinks)) != len(self.sinks):
            raise ValueError(f"sinks={list(self.sinks)} names a sink twice")
        if not self.wandb_project:
            raise ValueError(f"wandb_project={self.wandb_project!r} must not be empty")
