"""Typed, frozen run configuration, loaded from TOML.

Owns `RunConfig` and one nested Struct per component (`ModelConfig`, `EngineConfig`,
`CellConfig`, `TrajectoryConfig`, `RLConfig`). Every field has a unit in its name where it has
one and is validated at construction with `ValueError(f"{field=} ...")`; `load_config` turns
unknown keys, wrong types and bad values into one `ConfigError` line naming the key path
(``$.engine.max_model_len``) and the value. Components receive their own Struct and know
nothing about the file format.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, TypeVar

import msgspec

from gyre.errors import ConfigError

T = TypeVar("T")

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
    "RunConfig",
    "load_config",
    "load_toml",
    "config_from_dict",
]


class _Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base: frozen, keyword-only, unknown keys rejected."""


def _positive(**fields: float) -> None:
    for name, value in fields.items():
        if not value > 0:  # NaN fails too
            raise ValueError(f"{name}={value!r} must be > 0")


class ModelConfig(_Config):
    """The reference tiny model (`gyre.model`) or any Hugging Face folder vLLM can serve."""

    path: str = "runs/model"
    """Hugging Face model folder; created by `python -m gyre.model init` when `init_if_missing`."""
    init_if_missing: bool = True
    """Build the reference tiny model at `path` if the folder does not exist."""
    seed: int = 0
    """Seed of the tiny model's weights and tokenizer training."""
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vocab_size: int = 1024
    """Target BPE vocabulary size including special tokens."""
    max_position_embeddings: int = 32768

    def __post_init__(self) -> None:
        _positive(
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            vocab_size=self.vocab_size,
            max_position_embeddings=self.max_position_embeddings,
        )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} must be a multiple of "
                f"num_attention_heads={self.num_attention_heads}"
            )
        head_dim = self.hidden_size // self.num_attention_heads
        if head_dim < 32:  # vLLM's CPU attention rejects head_dim 16 (shared/notes, vLLM CPU)
            raise ValueError(
                f"head_dim={head_dim} (hidden_size / num_attention_heads) must be >= 32"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads={self.num_key_value_heads} must divide "
                f"num_attention_heads={self.num_attention_heads}"
            )
        if self.vocab_size < 300:
            raise ValueError(f"vocab_size={self.vocab_size} must be >= 300 (256 bytes + specials)")


class KVTransferConfig(_Config):
    """KV-cache migration between engines through vLLM's KV connectors
    (`gyre.engines.kv_connector`)."""

    connector: Literal["none", "example", "nixl"] = "none"
    """`none`: a redirected request recomputes its context; `example`: vLLM's ExampleConnector on a
    shared folder (exports written only on request, loaded by exact key); `nixl`: vLLM's
    NixlConnector, the target pulls the KV from the source engine's memory (UCX over shared memory
    on CPU, RDMA on GPU; needs the `nixl` package; its idle progress thread is turned off)."""
    shared_dir: str = "/dev/shm/gyre-kv"
    """Folder every cell of the run shares for `example` (host memory under /dev/shm); one per run
    when several runs share a host."""
    lease_s: float = 120.0
    """`example`: an export not released by then is deleted by the next export or release on any
    cell. `nixl`: how long the source keeps an export's blocks for the target to pull."""

    def __post_init__(self) -> None:
        _positive(lease_s=self.lease_s)
        if self.connector != "none" and not self.shared_dir:
            raise ValueError(
                f"shared_dir={self.shared_dir!r} must be set for connector={self.connector!r}"
            )


class EngineConfig(_Config):
    """The inference engine of every rollout cell."""

    backend: Literal["vllm", "scripted"] = "vllm"
    """`vllm` (real engine in a cell process) or `scripted` (deterministic fake, tests only)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    max_model_len: int = 4096
    """Longest prompt + completion in tokens."""
    kv_cache_memory_bytes: int = 256 * 2**20
    """KV cache size (on CPU: host RAM reserved for KV)."""
    block_size: int = 32
    """KV block size in tokens (vLLM's CPU default of 128 defeats prefix caching on short
    prompts)."""
    enable_prefix_caching: bool = True
    enforce_eager: bool = True
    """Skip torch.compile: saves ~22 s of start-up on CPU at equal speed for tiny models."""
    sleep_mode: bool = False
    """GPU only: `pause()` puts vLLM to sleep (level 1) so a cell switching to training frees
    its accelerator memory. vLLM's CPU backend refuses sleep mode (shared/notes)."""
    request_timeout_s: float = 600.0
    """Longest wait for one generate request before it is aborted."""
    startup_timeout_s: float = 300.0
    """Longest wait for a cell's engine to come up."""
    weight_load_timeout_s: float = 120.0
    """Longest wait for one `load_weights`."""
    kv_transfer: KVTransferConfig = KVTransferConfig()
    """KV-cache export/import for migrating requests between cells (off by default). When on, the
    engine never chunks a prefill (max_num_batched_tokens = max_model_len: a chunked store is
    corrupt)."""

    def __post_init__(self) -> None:
        _positive(
            max_model_len=self.max_model_len,
            kv_cache_memory_bytes=self.kv_cache_memory_bytes,
            block_size=self.block_size,
            request_timeout_s=self.request_timeout_s,
            startup_timeout_s=self.startup_timeout_s,
            weight_load_timeout_s=self.weight_load_timeout_s,
        )


class CellConfig(_Config):
    """Cell worker processes on this node."""

    num_cells: int = 1
    host: str = "127.0.0.1"
    """Address the cells' token-level API binds to (loopback unless the node spans hosts)."""
    base_port: int = 0
    """First port for cell APIs; 0 picks free ports."""

    def __post_init__(self) -> None:
        _positive(num_cells=self.num_cells)
        if not 0 <= self.base_port < 65536:
            raise ValueError(f"base_port={self.base_port} must be in [0, 65535]")


class SchedulerConfig(_Config):
    """Which cells roll out and which train (`gyre.runtime.scheduler`, driven by
    `gyre.runtime.elastic`).

    Used when the node runs more than one cell (`cells.num_cells > 1`)."""

    policy: Literal["colocate", "async", "elastic"] = "elastic"
    """`colocate`: every cell rolls out, then every cell trains; `async`: a fixed split of
    `async_train_cells` training cells; `elastic`: cells move between roles by the water level."""
    capacity_per_cell: int = 4
    """Concurrent executions one rollout cell hosts (bounded by its KV memory)."""
    async_train_cells: int = 1
    """Training cells of the `async` split (and of `elastic`'s pinned fallback)."""
    max_staleness_steps: int = 1
    """Versions an execution may start ahead of the step that trains it (AReaL's admission rule;
    `colocate` is always 0)."""
    streaming: bool = True
    """A step's batch is the first `batch_executions // group_size` groups to finish, trained group
    by group as they finish; off: the batch is the step's own dispatched groups, trained once all
    of them are in."""

    def __post_init__(self) -> None:
        _positive(
            capacity_per_cell=self.capacity_per_cell, async_train_cells=self.async_train_cells
        )
        if self.max_staleness_steps < 0:
            raise ValueError(f"max_staleness_steps={self.max_staleness_steps} must be >= 0")


class RouterConfig(_Config):
    """The router in front of the rollout cells (`gyre.runtime.router`): every wait it makes is
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
        _positive(
            attempt_timeout_s=self.attempt_timeout_s,
            abort_timeout_s=self.abort_timeout_s,
            no_cell_timeout_s=self.no_cell_timeout_s,
            request_timeout_s=self.request_timeout_s,
        )
        if self.max_retries < 0:
            raise ValueError(f"max_retries={self.max_retries} must be >= 0")
        if self.remember_finished < 0:
            raise ValueError(f"remember_finished={self.remember_finished} must be >= 0")


class TrajectoryConfig(_Config):
    """Trajectory trees -> training data (`gyre.trajectory`): Jmax selection and packing."""

    jmax: int = 8
    """Most root-to-leaf trajectories of one execution admitted to training (role priority)."""
    role_limits: dict[str, int] = {}
    """Optional cap per role (`main`, `main_summary`, `sub_agent`, `sub_agent_summary`)."""
    micro_batch_tokens: int = 16384
    """Token budget of one packed micro-batch (a larger tree gets a micro-batch to itself)."""

    def __post_init__(self) -> None:
        _positive(jmax=self.jmax, micro_batch_tokens=self.micro_batch_tokens)
        roles = ("main", "main_summary", "sub_agent", "sub_agent_summary")
        for role, limit in self.role_limits.items():
            if role not in roles or limit < 0:
                raise ValueError(
                    f"role_limits[{role!r}]={limit} needs a role in {roles} and a limit >= 0"
                )


class TrainerConfig(_Config):
    """The DeepSpeed trainer (`gyre.engines.trainer`)."""

    zero_stage: int = 1
    """DeepSpeed ZeRO stage: 0, 1 or 2 (stage 3 shards parameters, which the packed-tree forward
    reads directly; not supported yet)."""
    learning_rate: float = 1e-5
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    """Global gradient-norm clip (0 disables it)."""
    dtype: Literal["float32", "bfloat16", "float64"] = "float32"
    """Training dtype; float32 keeps trainer and vLLM logprobs within 1e-5 (float64: exactness
    tests only; vLLM does not serve it)."""
    keep_snapshots: int = 2
    """Weight snapshots kept on disk for the engines (older ones are deleted)."""
    train_timeout_s: float = 600.0
    """Longest a cell's training call may take (`/train`, `/step`, a gradient send or receive, a
    checkpoint); the gradient exchange fails with a clear error after it (docs/design.md
    invariant 7)."""

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 1, 2):
            raise ValueError(f"zero_stage={self.zero_stage} must be 0, 1 or 2")
        _positive(
            learning_rate=self.learning_rate,
            keep_snapshots=self.keep_snapshots,
            train_timeout_s=self.train_timeout_s,
        )
        if self.grad_clip < 0 or self.weight_decay < 0:
            raise ValueError(
                f"grad_clip={self.grad_clip} and weight_decay={self.weight_decay} must be >= 0"
            )
        for name, beta in (("adam_beta1", self.adam_beta1), ("adam_beta2", self.adam_beta2)):
            if not 0 <= beta < 1:
                raise ValueError(f"{name}={beta} must be in [0, 1)")


class RLConfig(_Config):
    """The policy loss (`gyre.rl`)."""

    clip_eps: float = 0.2
    """PPO clip range: ratios outside [1 - clip_eps, 1 + clip_eps] stop the gradient."""
    is_cap: float = 2.0
    """Truncated importance-sampling cap on the ratio (dual clip for negative advantages)."""
    max_staleness: int = 2
    """Most weight versions a policy token may lag the trainer; older tokens are masked out."""
    logprob_chunk_size: int = 1024
    """Positions per chunk of the fused selective logprob (extra memory chunk x vocab)."""

    def __post_init__(self) -> None:
        if not 0 < self.clip_eps < 1:
            raise ValueError(f"clip_eps={self.clip_eps} must be in (0, 1)")
        if self.is_cap < 1 + self.clip_eps:
            raise ValueError(f"is_cap={self.is_cap} must be >= 1 + clip_eps")
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness={self.max_staleness} must be >= 0")
        _positive(logprob_chunk_size=self.logprob_chunk_size)


class ProxyConfig(_Config):
    """The TITO proxy: the OpenAI-compatible endpoint agents talk to (`gyre.tito.proxy`)."""

    host: str = "127.0.0.1"
    """Address the proxy binds to."""
    port: int = 0
    """TCP port; 0 picks a free one (the bound port is reported when serving starts)."""
    model_name: str = "gyre"
    """Model name served at /v1/models; requests naming another model get 404."""
    max_body_bytes: int = 16 * 2**20
    """Largest request body accepted; larger ones get 413 (a 1M-token history is ~4-5 MB of
    JSON)."""
    max_n: int = 16
    """Most choices per request."""
    context_overflow: Literal["clamp", "refuse"] = "clamp"
    """prompt + max_tokens over the engine's max_model_len: clamp max_tokens (finish `length` when
    reached) or refuse with a `context_length_exceeded` error (FIELD_CASES B15)."""
    render_check_every: int = 0
    """Cross-check every k-th incrementally rendered prompt against a full render; 0: only the
    first of each execution."""
    flush_interval_s: float = 5.0
    """fsync the call log this often (calls reach the OS before each response completes)."""
    log_name: str = "calls.log"
    """Call log file name under `<run_dir>/`."""

    def __post_init__(self) -> None:
        _positive(
            max_body_bytes=self.max_body_bytes,
            max_n=self.max_n,
            flush_interval_s=self.flush_interval_s,
        )
        if not 0 <= self.port < 65536:
            raise ValueError(f"port={self.port} must be in [0, 65535]")
        if self.render_check_every < 0:
            raise ValueError(f"render_check_every={self.render_check_every} must be >= 0")


class HarnessConfig(_Config):
    """Agent processes of executions (`gyre.agents.harness`): command, limits, workspaces."""

    agent_command: tuple[str, ...] = ()
    """Command line of the agent; empty: the reference agent (`python -m gyre.agents.react`)."""
    workspace_root: str = ""
    """Folder of the per-execution private folders; empty: `<run_dir>/executions`."""
    kill_grace_s: float = 1.0
    """Seconds between SIGTERM and SIGKILL of an agent's process tree at its deadline."""
    cpu_time_s: float = 3600.0
    """RLIMIT_CPU of each agent process, CPU seconds; 0: no limit."""
    memory_bytes: int = 4 * 2**30
    """RLIMIT_AS of each agent and verifier process, bytes; 0: no limit."""
    max_processes: int = 256
    """Extra tasks an agent may create (RLIMIT_NPROC over the uid's current count); 0: no limit."""
    file_size_bytes: int = 256 * 2**20
    """RLIMIT_FSIZE of agent and verifier processes, bytes; 0: no limit."""
    keep_workspaces: bool = False
    """Keep each execution's folder after scoring (debugging)."""
    isolate_uid: bool = True
    """When the node runs as root: each agent runs as its own unprivileged uid and cannot read
    other workspaces or hidden tests (`gyre.agents.isolation`); otherwise a warning."""
    agent_uid_base: int = 200_000
    """First uid (and gid) of agents under `isolate_uid`; must be >= 1000 and no real user's."""
    agent_uid_count: int = 4096
    """Agent uids from `agent_uid_base` on: the most isolated executions running at once on a
    node."""
    isolate_mounts: bool = True
    """With `isolate_uid`: each agent and verifier starts in a private mount namespace where every
    top-level folder but the system's (/usr, /etc, /var, ...), `hidden_paths`, the run folder,
    other workspaces and the suites' hidden tests are covered, and /tmp is private
    (`gyre.agents.isolation`; needs CAP_SYS_ADMIN; otherwise a warning)."""
    require_isolation: bool = False
    """Refuse to run (one `ConfigError` before anything starts) where `isolate_uid`,
    `isolate_mounts` and `isolate_network` cannot all be had (not root, no CAP_SYS_ADMIN, a
    workspace root other users cannot reach), instead of warning and running agents with the
    node's view of its files and ports. Turn it on wherever a policy that reads hidden tests
    would be rewarded for it."""
    isolate_network: bool = True
    """Each agent runs in a network namespace of its own where only the proxy answers, at the
    address of its `OPENAI_BASE_URL` (relayed from the node's namespace): the node's cells, gloo
    TCPStore, other ports and unix sockets, and the outside world, are out of reach
    (`gyre.agents.isolation`; needs root with CAP_SYS_ADMIN, or unprivileged user namespaces,
    which keep the node's unix sockets at a path in reach; otherwise a warning)."""
    hidden_paths: tuple[str, ...] = ("/root",)
    """Absolute folders agents and verifiers never see (the interpreter's installation and the
    gyre package are bound back even when they live under one)."""
    visible_paths: tuple[str, ...] = ()
    """Absolute folders or files agents and verifiers see read-only although they lie under a
    covered top-level folder (tools under /opt, a data set under /home). The interpreter's
    installation, the gyre package and the files the agent command names are shown anyway."""

    def __post_init__(self) -> None:
        if self.kill_grace_s < 0:
            raise ValueError(f"kill_grace_s={self.kill_grace_s} must be >= 0")
        if self.require_isolation and not (self.isolate_uid and self.isolate_mounts):
            raise ValueError("require_isolation needs isolate_uid and isolate_mounts to be true")
        if self.require_isolation and not self.isolate_network:
            raise ValueError("require_isolation needs isolate_network to be true")
        for key in ("hidden_paths", "visible_paths"):
            for path in getattr(self, key):
                if not path.startswith("/"):
                    raise ValueError(f"{key}: {path!r} must be absolute")
        base, count = self.agent_uid_base, self.agent_uid_count
        if base < 1000 or count < 1 or base + count > 2**31:
            raise ValueError(
                f"agent_uid_base={self.agent_uid_base}, "
                f"agent_uid_count={self.agent_uid_count}: need "
                "base >= 1000, count >= 1 and base + count <= 2**31"
            )
        for name in ("cpu_time_s", "memory_bytes", "max_processes", "file_size_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0 (0: no limit)")


class TaskConfig(_Config):
    """Which task suites a run samples from, and how executions run (`gyre.tasks`,
    `gyre.agents`)."""

    suites: tuple[str, ...] = ("examples/tasks/learnable",)
    """Suite folders (see `python -m gyre.tasks generate`)."""
    harness: HarnessConfig = HarnessConfig()

    def __post_init__(self) -> None:
        if not self.suites:
            raise ValueError(f"suites={self.suites!r} must name at least one suite folder")


class LoopConfig(_Config):
    """The RL loop (`gyre.runtime.loop`): steps, batches, groups, held-out evaluation."""

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
    """Evaluate every N steps (0: only before the first and after the last step)."""
    max_concurrent_executions: int = 8
    """Agent processes running at once."""
    keep_checkpoints: int = 2
    """Step checkpoints kept on disk (weights, optimizer, loop state)."""

    def __post_init__(self) -> None:
        _positive(
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


class WarmStartConfig(_Config):
    """Supervised warm start (`gyre.model.sft`): the tiny model learns the `learnable` suite's
    demonstrations before RL, so RL starts from a non-zero pass rate."""

    enabled: bool = True
    """Fine-tune before RL; False starts RL from `model.path` as it is."""
    path: str = ""
    """Output model folder (cached by input hash); empty: `<model.path>-sft`."""
    examples: int = 3072
    """Demonstrations generated with `learnable_examples` (shipped suite instructions excluded).
    With the default 2 epochs (768 steps of 8) the tiny model copies the word and path from the
    instruction (held-out pass rate 65% at T=1); 384 steps only start to (20%), fewer learn the
    call format only (`gyre.model.sft` docstring)."""
    epochs: int = 2
    """Passes over the demonstrations."""
    batch_size: int = 8
    """Demonstrations per optimizer step."""
    learning_rate: float = 5e-3
    """Peak AdamW learning rate (linear warm-up, cosine decay to 10%)."""
    warmup_steps: int = 10
    weight_decay: float = 0.0
    seed: int = 1
    """Seed of the demonstrations and of the batch order; keep it unlike the suite's seed."""
    heldout_suite_seed: int = 0
    """Seed of the shipped `learnable` suite whose instructions are never used as demonstrations."""
    slip_fraction: float = 0.0
    """Share of demonstrations in which the teacher slips: the written word ends with a full stop
    (`pearl.`), a prose habit the hidden test (exact word) rejects. The warm-started policy
    inherits the habit and RL must drop it from the reward alone; 0 is a flawless teacher, with
    which the tiny model's remaining errors are half-copied words that RL on 24 training tasks
    does not fix (`examples/cpu.toml`). Drawn per demonstration with a fixed seed. In [0, 1)."""

    def __post_init__(self) -> None:
        _positive(
            examples=self.examples,
            epochs=self.epochs,
            batch_size=self.batch_size,
            learning_rate=self.learning_rate,
        )
        if not 0 <= self.slip_fraction < 1:
            raise ValueError(f"slip_fraction={self.slip_fraction} must be in [0, 1)")
        if self.warmup_steps < 0 or self.weight_decay < 0:
            raise ValueError(
                f"warmup_steps={self.warmup_steps} and weight_decay={self.weight_decay} "
                "must be >= 0"
            )


class ObserveConfig(_Config):
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
        _positive(poll_interval_s=self.poll_interval_s)


class ReportConfig(_Config):
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


class RunConfig(_Config):
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

    def __post_init__(self) -> None:
        if not self.run_dir:
            raise ValueError(f"run_dir={self.run_dir!r} must not be empty")


def config_from_dict(data: dict) -> RunConfig:
    """Build a `RunConfig` from plain data; raises `ConfigError` naming the key and value."""
    try:
        return msgspec.convert(data, RunConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid config: {exc}") from None


def load_config(path: str | os.PathLike[str]) -> RunConfig:
    """Read a TOML run config. Raises `ConfigError` (one line: file, key path, value)."""
    return load_toml(path, RunConfig)


def load_toml(path: str | os.PathLike[str], type_: type[T]) -> T:
    """Read a TOML file as the config Struct `type_` (also used by `gyre.sim`'s own configs).

    Raises `ConfigError` (one line: file, key path, value)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config {str(path)!r}: {exc.strerror}") from None
    try:
        return msgspec.toml.decode(raw, type=type_)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
