"""The DeepSpeed trainer: one optimizer step per batch of packed trajectory trees.

Owns `DeepSpeedTrainer` and `TrainStatistics`. The model is a Hugging Face causal LM under a
DeepSpeed ZeRO engine (stage 0-2; gloo on CPU, NCCL on GPU) with a torch AdamW client optimizer
(bit-identical to plain torch AdamW in fp32, shared/notes). DeepSpeed's gradient accumulation is
unmanaged: a batch may have any number of micro-batches, each `backward()` adds its gradient (the
loss weights already normalise per execution and per batch), and `step()` is the boundary. A
non-finite loss or gradient skips the step on every rank and leaves weights and optimizer state
unchanged. Weight snapshots are Hugging Face folders that vLLM's `reload_weights` reads.
Blocking: call it from a worker thread, never on an event loop. Knows nothing about engines or HTTP.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec
import torch

from gyre.config import RLConfig, TrainerConfig
from gyre.rl import grads_finite, microbatch_loss
from gyre.trajectory.pack import PackedBatch

__all__ = ["DeepSpeedTrainer", "TrainStatistics", "init_process_group"]

logger = logging.getLogger(__name__)


class TrainStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What one `train_batch` did."""

    version: int
    """Weight version after the call (bumped only when the step was applied)."""
    applied: bool
    """False when a non-finite loss or gradient skipped the step."""
    micro_batches: int
    tokens: int
    """Packed tokens forwarded (shared prefixes once)."""
    policy_tokens: int
    """Tokens that carried loss."""
    loss: float
    """Sum of the micro-batch losses (the batch loss; non-finite when the step was skipped for it)."""
    grad_norm: float | None
    """Global gradient norm before clipping (None when skipped)."""
    logprob_abs_diff_mean: float
    """Mean |trainer logprob - behaviour logprob| over loss tokens (the off-policy mismatch)."""
    mean_ratio: float
    """Mean importance ratio pi_trainer / pi_behaviour over loss tokens (1 when on-policy)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_process_group() -> None:
    """Join (or form) torch.distributed for DeepSpeed: from RANK/WORLD_SIZE/MASTER_* when a
    launcher set them, else a one-process group on a free loopback port. No rendezvous variable is
    written to the environment, so child processes (agents, other nodes) never inherit a stale one
    (only LOCAL_RANK=0, which DeepSpeed requires)."""
    import deepspeed

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if not torch.distributed.is_initialized() and "WORLD_SIZE" not in os.environ:
        torch.distributed.init_process_group(
            backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
        )
    os.environ.setdefault("LOCAL_RANK", "0")  # DeepSpeed's engine asserts it; harmless to children
    deepspeed.init_distributed(dist_backend=backend)  # adopts an existing group


class DeepSpeedTrainer:
    """A DeepSpeed ZeRO engine over a Hugging Face model, trained on packed trees.

    Args:
        model_dir: Hugging Face folder to start from.
        config: optimiser and ZeRO settings.
        rl: the policy-loss settings.
        version: weight version of the loaded weights.
    """

    def __init__(self, model_dir: str | Path, config: TrainerConfig, rl: RLConfig, *, version: int = 0) -> None:
        import deepspeed
        from transformers import AutoModelForCausalLM

        init_process_group()
        dtype = torch.float32 if config.dtype == "float32" else torch.bfloat16
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=config.learning_rate, betas=(config.adam_beta1, config.adam_beta2),
            weight_decay=config.weight_decay,
        )
        ds_config = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "managed_gradient_accumulation": False,
            "zero_optimization": {"stage": config.zero_stage},
            "zero_allow_untested_optimizer": True,
            "gradient_clipping": config.grad_clip,
            "bf16": {"enabled": dtype == torch.bfloat16},
            "steps_per_print": 2**31 - 1,
        }
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
        self.config = config
        self.rl = rl
        self.version = version

    @property
    def model(self) -> torch.nn.Module:
        """The Hugging Face model (full parameters at ZeRO stages 0-2)."""
        return self.engine.module

    def train_batch(self, micro_batches: Sequence[PackedBatch], advantages: Mapping[str, float | None]) -> TrainStatistics:
        """Forward/backward every micro-batch of one batch, then one optimizer step.

        `advantages` maps each execution id to its advantage (None: no loss). Raises
        `ValueError` for an empty batch or an execution without an advantage.
        """
        if not micro_batches:
            raise ValueError("train_batch needs at least one micro-batch")
        self.engine.train()
        total_loss, tokens, policy_tokens = 0.0, 0, 0
        abs_diff_sum, ratio_sum, counted = 0.0, 0.0, 0
        finite = True
        for batch in micro_batches:
            loss, stats = microbatch_loss(
                self.model, batch, advantages, trainer_version=self.version,
                max_staleness=self.rl.max_staleness, clip_eps=self.rl.clip_eps, is_cap=self.rl.is_cap,
                chunk_size=self.rl.logprob_chunk_size,  # each token at its call's own temperature (B05)
            )
            tokens += batch.num_tokens
            policy_tokens += stats.tokens
            if stats.tokens:
                abs_diff_sum += stats.mean_abs_logprob_diff * stats.tokens
                ratio_sum += stats.mean_ratio * stats.tokens
                counted += stats.tokens
            # backward even on a non-finite loss: every rank runs the same collectives, and the
            # all-reduced finite check below skips the step everywhere
            finite = finite and bool(torch.isfinite(loss))
            self.engine.backward(loss, scale_wrt_gas=False)
            total_loss += float(loss.detach())
        finite = finite and grads_finite(self.model.parameters())
        grad_norm = None
        if finite:
            self.engine.step()
            grad_norm = self.engine.get_global_grad_norm()
            grad_norm = None if grad_norm is None else float(grad_norm)
            self.version += 1
        else:
            logger.warning("non-finite loss or gradient: optimizer step skipped at version %d", self.version)
        self.engine.zero_grad()
        return TrainStatistics(
            version=self.version, applied=finite, micro_batches=len(micro_batches), tokens=tokens,
            policy_tokens=policy_tokens, loss=total_loss, grad_norm=grad_norm,
            logprob_abs_diff_mean=abs_diff_sum / counted if counted else float("nan"),
            mean_ratio=ratio_sum / counted if counted else float("nan"),
        )

    def save_snapshot(self, root: str | Path) -> Path:
        """Write the current weights as `root/v<version>` (Hugging Face folder, safetensors) for the
        engines; keeps the newest `keep_snapshots` and deletes older ones. Returns the folder."""
        root = Path(root)
        path = root / f"v{self.version}"
        tmp = root / f".v{self.version}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        self.model.save_pretrained(tmp, safe_serialization=True)
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
        snapshots = sorted((p for p in root.glob("v*") if p.name[1:].isdigit()), key=lambda p: int(p.name[1:]))
        for old in snapshots[: -self.config.keep_snapshots]:
            shutil.rmtree(old, ignore_errors=True)
        return path

    def save_checkpoint(self, path: str | Path) -> None:
        """Weights, optimizer state and version (DeepSpeed's checkpoint format) at `path`."""
        self.engine.save_checkpoint(str(path), tag="state", client_state={"version": self.version})

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore what `save_checkpoint` wrote. Raises `FileNotFoundError` if there is none."""
        load_path, client_state = self.engine.load_checkpoint(str(path), tag="state")
        if load_path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {str(path)!r}")
        self.version = int(client_state["version"])
