"""Configs of the engines: the model, the inference engine (with its KV transfer) and the trainer.

Owns `ModelConfig`, `KVTransferConfig`, `EngineConfig` and `TrainerConfig`: what a cell needs
to load a model, serve it with vLLM and train it with DeepSpeed. Knows nothing about the
runners that use them or the file format (`gyre.config.load_config`).
"""

from __future__ import annotations

from typing import Literal

from gyre.config.base import Config, check_positive

__all__ = ["ModelConfig", "KVTransferConfig", "EngineConfig", "TrainerConfig"]


class ModelConfig(Config, frozen=True):
    """The reference tiny model (`gyre.model`) or any Hugging Face folder vLLM can serve."""

    path: str = "runs/model"
    """Hugging Face model folder (the tiny model: `python -m gyre.model init DIR`)."""
    init_if_missing: bool = False
    """Build the reference tiny model at `path` when the folder does not exist (or is empty).
    Off by default, so a mistyped path to one's own model is an error, never a tiny model
    trained in its place (`gyre.job.ensure_model`)."""
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
        check_positive(
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
        if head_dim < 32:  # vLLM's CPU attention rejects head_dim 16 (docs/notes/vllm-cpu.md)
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


class KVTransferConfig(Config, frozen=True):
    """KV-cache migration between engines through vLLM's KV connectors
    (`gyre.engines.kv_connector`): how a request redirected off a cell that leaves rollout
    continues on another (`gyre.runtime.elastic_job.continuation_for`).

    On by default (`example`, on a folder of the run's own): when no request migrates it costs no
    measurable cell start-up, decode or prefill time on CPU, all within the run-to-run spread
    (`benchmarks/results/connector_idle.json`; vLLM's scheduling is the same: no async scheduling
    or chunked prefill on CPU either way, prefix caching on).
    Raises `ValueError` for a non-positive `lease_s`, or a `shared_dir` with another connector than
    `example` (it would be ignored)."""

    connector: Literal["none", "example", "nixl"] = "example"
    """`example` (the default): vLLM's ExampleConnector on a shared folder (exports written only
    on request, loaded by exact key; works on vLLM's CPU backend); the KV of a redirected request
    moves, recompute is the fallback. `nixl`: vLLM's NixlConnector, the target pulls the KV from
    the source engine's memory (UCX over shared memory on CPU, RDMA on GPU; needs the `nixl`
    package; its idle progress thread is turned off). `none`: no connector, a redirected request
    recomputes its context (the opt-out)."""
    shared_dir: str = ""
    """`example` only: the folder every cell of the run shares. Empty (the default): a folder of
    the run's own, `/dev/shm/gyre-kv-<random>` (under the system's temporary folder where there
    is no /dev/shm), made before the run's cells start and removed when they stop, on error too
    (`gyre.engines.kv_transport.open_kv_folder`); so concurrent runs never share one. The run
    holds a lock file in it, and a folder whose run was killed (kill -9) is removed when the next
    run makes its own beside it. A path is used as given and left in place (its expired exports
    are swept)."""
    lease_s: float = 120.0
    """`example`: an export not released by then is deleted by the next export or release on any
    cell. `nixl`: how long the source keeps an export's blocks for the target to pull."""

    def __post_init__(self) -> None:
        check_positive(lease_s=self.lease_s)
        if self.shared_dir and self.connector != "example":
            raise ValueError(
                f"shared_dir={self.shared_dir!r} is only used by connector='example' "
                f"(connector={self.connector!r}): remove it"
            )


class EngineConfig(Config, frozen=True):
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
    its accelerator memory. vLLM's CPU backend refuses sleep mode (docs/notes/vllm-cpu.md)."""
    stream_interval: int = 4
    """vLLM hands a request's tokens to the cell in chunks of this many: the first token and the
    request's end at once, the rest every `stream_interval` tokens (vLLM's own
    `SchedulerConfig.stream_interval`). 1 wakes each request's consumer in the cell at every
    engine step, and 4 costs the cell process less CPU a batch (`docs/notes/engine-speed.md`).
    A weight load keeps
    every token sampled (vLLM's final abort output carries those not yet handed over, at the
    version that sampled them); an abort by the caller (`/abort`, so a redirect, or a deadline)
    returns what the stream carried, so up to `stream_interval - 1` sampled tokens are dropped
    and sampled again where the request continues. A stop string's abort on the node comes up to
    `stream_interval - 1` tokens later."""
    request_timeout_s: float = 600.0
    """Longest wait for one generate request before it is aborted."""
    startup_timeout_s: float = 300.0
    """Longest wait for a cell's engine to come up."""
    weight_load_timeout_s: float = 120.0
    """Longest wait for one `load_weights`."""
    kv_transfer: KVTransferConfig = KVTransferConfig()
    """KV-cache export/import for migrating requests between cells (on by default: `example`).
    With `example` the engine never chunks a prefill (max_num_batched_tokens = max_model_len: a
    chunked store is corrupt; on CPU it never chunks anyway)."""

    def __post_init__(self) -> None:
        check_positive(
            max_model_len=self.max_model_len,
            kv_cache_memory_bytes=self.kv_cache_memory_bytes,
            block_size=self.block_size,
            stream_interval=self.stream_interval,
            request_timeout_s=self.request_timeout_s,
            startup_timeout_s=self.startup_timeout_s,
            weight_load_timeout_s=self.weight_load_timeout_s,
        )


class TrainerConfig(Config, frozen=True):
    """The DeepSpeed trainer (`gyre.engines.trainer`)."""

    zero_stage: int = 1
    """DeepSpeed ZeRO stage: 0-3. Stage 3 shards parameters, gradients and Adam state over a
    cell's `cells.devices_per_cell` ranks (`gyre.engines.zero3`; each pass gathers the whole
    parameters once); a cell of several devices needs it."""
    learning_rate: float = 1e-5
    warmup_steps: int = 0
    """Linear learning-rate warm-up: optimizer step k (1-based) uses
    `learning_rate * min(1, k / warmup_steps)`; 0 or 1: the full rate from the first step. Adam's
    first steps move every parameter by about the full rate whatever its gradient (m/sqrt(v) is
    about +-1), which warm-up tempers (Liu et al. 2020, "On the Variance of the Adaptive Learning
    Rate and Beyond"). Steps not applied (a non-finite gradient, no gradient) do not count; the
    position is in the checkpoint, and a resume whose `learning_rate` or `warmup_steps` differs
    from the checkpoint's is refused (`gyre.engines.schedule`)."""
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    """Adam's epsilon, added to sqrt(v) in the update's denominator (PyTorch's AdamW default).
    Where a parameter's gradient RMS is far above it, every step moves that parameter by about
    the full rate whatever its gradient's size; one near it (1e-5 is common in PPO code, e.g.
    OpenAI Baselines' ppo2) damps the steps of parameters whose gradients are small."""
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    """Global gradient-norm clip (0 disables it)."""
    dtype: Literal["float32", "bfloat16", "float64"] = "float32"
    """Training dtype; float32 keeps trainer and vLLM logprobs within 1e-5 (float64: exactness
    tests only; vLLM does not serve it)."""
    keep_snapshots: int = 2
    """Weight snapshots kept on disk for the engines (older ones are deleted)."""
    attention: Literal["sdpa", "flex"] = "sdpa"
    """Tree attention of the training forward (`gyre.rl.packed_forward`): `sdpa` (CPU and GPU;
    query blocks of a chunk, checkpointed) or `flex` (a FlexAttention BlockMask per chunk; CUDA
    only, refused at trainer start elsewhere)."""
    logprob_impl: Literal["torch", "triton"] = "torch"
    """Selective logprob + entropy kernel (`gyre.kernels.selective_logprob`): `torch` (anywhere)
    or `triton` (CUDA only, refused at trainer start elsewhere)."""
    train_timeout_s: float = 600.0
    """Longest a cell's training call may take (`/train`, `/step`, a gradient send or receive, a
    checkpoint); the gradient exchange fails with a clear error after it (docs/design.md
    invariant 7)."""

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage={self.zero_stage} must be 0, 1, 2 or 3")
        if self.attention not in ("sdpa", "flex"):
            raise ValueError(f"trainer.attention={self.attention!r} must be 'sdpa' or 'flex'")
        if self.logprob_impl not in ("torch", "triton"):
            raise ValueError(
                f"trainer.logprob_impl={self.logprob_impl!r} must be 'torch' or 'triton'"
            )
        check_positive(
            learning_rate=self.learning_rate,
            keep_snapshots=self.keep_snapshots,
            train_timeout_s=self.train_timeout_s,
            adam_eps=self.adam_eps,
        )
        if self.grad_clip < 0 or self.weight_decay < 0 or self.warmup_steps < 0:
            raise ValueError(
                f"grad_clip={self.grad_clip}, weight_decay={self.weight_decay} and "
                f"warmup_steps={self.warmup_steps} must be >= 0"
            )
        for name, beta in (("adam_beta1", self.adam_beta1), ("adam_beta2", self.adam_beta2)):
            if not 0 <= beta < 1:
                raise ValueError(f"{name}={beta} must be in [0, 1)")
