"""The DeepSpeed trainer, and the guarded step: skip the update when any gradient is non-finite.

Owns `DeepSpeedTrainer` (the `gyre.engines.protocol.Trainer`: a Hugging Face causal LM under a
DeepSpeed ZeRO 0-2 engine, gloo on CPU, NCCL on GPU, with a torch AdamW client optimizer,
bit-identical to plain AdamW in fp32), `grads_finite` / `step_if_finite`, and DeepSpeed start-up
(`init_process_group`, `prepare_extensions_dir`, `build_ops`). A step is `accumulate`
(micro-batches forward/backward; DeepSpeed's accumulation unmanaged) or `add_gradient_vector` (a
satellite's flat gradient, added exactly), then `apply_step`. Blocking: call it from a worker
thread. Knows nothing about engines, HTTP, trees or the loss: a batch is a `MicroBatch`, its loss
comes from the caller's `Objective`; weight snapshots are Hugging Face folders vLLM reloads.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import torch

from gyre.config import TrainerConfig
from gyre.engines.protocol import (
    AccumulateStatistics,
    MicroBatch,
    Objective,
    StepStatistics,
    TrainerStatistics,
    TrainStatistics,
    mismatch_split,
)

__all__ = [
    "DeepSpeedTrainer",
    "grads_finite",
    "step_if_finite",
    "init_process_group",
    "prepare_extensions_dir",
    "build_ops",
]

logger = logging.getLogger(__name__)


def grads_finite(params: Iterable[torch.nn.Parameter]) -> bool:
    """True when every existing `.grad` of `params` is finite, on this rank and (if
    torch.distributed is initialised) on every rank of the default group (an all-reduce of one
    int32 flag, so every rank agrees to step or to skip)."""
    ok = True
    for p in params:
        if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
            ok = False
            break
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
        ok = bool(flag.item())
    return ok


def step_if_finite(optimizer: torch.optim.Optimizer) -> bool:
    """The guarded step for a plain torch optimizer: `optimizer.step()` if every gradient of its
    parameters is finite (`grads_finite`), then zero the gradients (set to None) either way.
    Returns True when the step was applied, False when it was skipped."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    ok = grads_finite(params)
    if ok:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return ok


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


STALE_BUILD_LOCK_S = 600.0
"""Age (seconds) past which a JIT-build lock counts as left by a killed build. DeepSpeed's
`deepspeed_shm_comm` build takes about 55 s on the 2-core CPU machine (shared/notes)."""

_JIT_OPS = ("deepspeed_shm_comm",)
"""DeepSpeed ops that `deepspeed.init_distributed` JIT-builds on the CPU accelerator."""


def prepare_extensions_dir() -> Path:
    """The folder torch JIT-builds C++ extensions into, made this environment's own.

    Sets TORCH_EXTENSIONS_DIR to `<sys.prefix>/torch_extensions` when unset: an op is compiled
    against this environment's torch, so the build belongs with it rather than in the user-wide
    `~/.cache/torch_extensions` that every environment shares. Then removes a build lock of
    `_JIT_OPS` older than `STALE_BUILD_LOCK_S`, with a warning: torch's FileBaton waits forever on
    a lock whose builder was killed (one killed trainer start would hang every later one).
    """
    root = Path(
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    )
    for op in _JIT_OPS:
        lock = root / op / "lock"
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            continue
        if age > STALE_BUILD_LOCK_S:
            logger.warning("removing %s, left %.0f s ago by a build that never finished", lock, age)
            lock.unlink(missing_ok=True)
    return root


def build_ops() -> None:
    """JIT-build, once, the DeepSpeed ops that trainer start-up needs (`make` runs this after the
    install, so no trainer start, possibly killed, is the one that builds). A no-op where the
    accelerator has no such op or it is already built."""
    prepare_extensions_dir()
    from deepspeed.comm.torch import build_shm_op

    build_shm_op()


def init_process_group() -> None:
    """Join (or form) torch.distributed for DeepSpeed: from RANK/WORLD_SIZE/MASTER_* when a
    launcher set them, else a one-process group on a free loopback port. No rendezvous variable is
    written to the environment, so child processes (agents, other nodes) never inherit a stale one
    (only LOCAL_RANK=0, which DeepSpeed requires, and TORCH_EXTENSIONS_DIR:
    `prepare_extensions_dir`)."""
    prepare_extensions_dir()
    import deepspeed

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if not torch.distributed.is_initialized() and "WORLD_SIZE" not in os.environ:
        torch.distributed.init_process_group(
            backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
        )
    os.environ.setdefault("LOCAL_RANK", "0")  # DeepSpeed's engine asserts it; harmless to children
    deepspeed.init_distributed(dist_backend=backend)  # adopts an existing group


class DeepSpeedTrainer:
    """A DeepSpeed ZeRO engine over a Hugging Face model, trained with a caller's objective.

    Args:
        model_dir: Hugging Face folder to start from.
        config: optimiser and ZeRO settings.
        objective: the loss of one micro-batch (`gyre.rl.PolicyObjective` for the policy loss),
            called as `objective(model, batch, advantages, version=self.version)`.
        version: weight version of the loaded weights.
    """

    def __init__(
        self,
        model_dir: str | Path,
        config: TrainerConfig,
        objective: Objective,
        *,
        version: int = 0,
    ) -> None:
        import deepspeed
        from transformers import AutoModelForCausalLM

        from gyre.errors import ConfigError
        from gyre.kernels.cached_tree_attention import (
            check_attention_backend,
            check_logprob_backend,
        )

        device = "cuda" if torch.cuda.is_available() else "cpu"  # DeepSpeed's accelerator
        for key, check, value in (
            ("attention", check_attention_backend, config.attention),
            ("logprob_impl", check_logprob_backend, config.logprob_impl),
        ):
            try:
                check(value, device)
            except ValueError as exc:
                raise ConfigError(f"trainer.{key}={value!r}: {exc}") from None
        init_process_group()
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}[
            config.dtype
        ]
        load_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=load_dtype, attn_implementation="sdpa"
        )
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=config.learning_rate,
            betas=(config.adam_beta1, config.adam_beta2),
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
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=ds_config
        )
        if dtype == torch.float64:
            # DeepSpeed has no float64 path: its all-reduce asserts on fp64 grads (ZeRO 0) and
            # its ZeRO 1-2 partitions give wrong updates. On one rank that all-reduce is a no-op,
            # so float64 (exactness tests) runs ZeRO 0 on a one-rank group without it.
            if config.zero_stage != 0 or torch.distributed.get_world_size() != 1:
                raise ValueError(
                    "dtype='float64' needs zero_stage=0 on a one-rank group, "
                    f"got zero_stage={config.zero_stage}, "
                    f"world size {torch.distributed.get_world_size()}"
                )
            self.engine.enable_backward_allreduce = False
        self.config = config
        self.objective = objective
        self.version = version
        self._grad_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        self._has_gradients = False
        self._vector: torch.Tensor | None = (
            None  # the last gradient_vector(), until the grads change
        )
        self._finite = True  # every loss and added vector since the last step was finite
        self._steps_applied = self._steps_skipped = self._vectors_added = 0
        self._micro_batches = self._tokens = 0

    @property
    def model(self) -> torch.nn.Module:
        """The Hugging Face model (full parameters at ZeRO stages 0-2)."""
        return self.engine.module

    def train_batch(
        self, micro_batches: Sequence[MicroBatch], advantages: Mapping[str, float | None]
    ) -> TrainStatistics:
        """Forward/backward every micro-batch of one batch, then one optimizer step
        (`accumulate` + `apply_step`).

        `advantages` maps each execution id to its advantage (None: no loss). Raises
        `ValueError` for an empty batch or an execution without an advantage.
        """
        acc = self.accumulate(micro_batches, advantages)
        step = self.apply_step(finite=acc.finite)
        return TrainStatistics(
            version=step.version,
            applied=step.applied,
            micro_batches=acc.micro_batches,
            tokens=acc.tokens,
            policy_tokens=acc.policy_tokens,
            loss=acc.loss,
            grad_norm=step.grad_norm,
            logprob_abs_diff_mean=acc.logprob_abs_diff_sum / acc.counted
            if acc.counted
            else float("nan"),
            **mismatch_split([acc]),
            mean_ratio=acc.ratio_sum / acc.counted if acc.counted else float("nan"),
        )

    @property
    def has_gradients(self) -> bool:
        """True between an `accumulate` / `add_gradient_vector` and the next `apply_step` /
        `zero_grad`: gradients are held that no step or send has consumed yet."""
        return self._has_gradients

    def accumulate(
        self, micro_batches: Sequence[MicroBatch], advantages: Mapping[str, float | None]
    ) -> AccumulateStatistics:
        """Forward/backward every micro-batch under the objective, adding its gradient to the
        accumulation; no step.

        The objective's losses already normalise per execution and per batch (the policy loss's
        weights do), so the gradients of a batch's micro-batches simply add up, on one trainer or
        spread over several.
        Raises `ValueError` for no micro-batches or an execution without an advantage (checked
        for every micro-batch before any backward, so a refused call adds nothing).
        """
        if not micro_batches:
            raise ValueError("accumulate needs at least one micro-batch")
        for batch in micro_batches:
            missing = [e for e in batch.execution_ids if e not in advantages]
            if missing:
                raise ValueError(f"executions {missing} have no advantage (pass None for no loss)")
        self.engine.train()
        total_loss, tokens, policy_tokens = 0.0, 0, 0
        abs_diff_sum, ratio_sum, counted = 0.0, 0.0, 0
        same_sum, same_counted = 0.0, 0
        finite = True
        for batch in micro_batches:
            loss, stats = self.objective(
                self.model,
                batch,
                advantages,
                version=self.version,
                attention=self.config.attention,
                logprob_impl=self.config.logprob_impl,
            )
            tokens += batch.num_tokens
            policy_tokens += stats.tokens
            if stats.tokens:
                abs_diff_sum += stats.mean_abs_logprob_diff * stats.tokens
                ratio_sum += stats.mean_ratio * stats.tokens
                counted += stats.tokens
            same = getattr(stats, "same_version_tokens", 0)  # an Objective may not report it
            if same:
                same_sum += stats.same_version_abs_logprob_diff * same
                same_counted += same
            # backward even on a non-finite loss: every rank runs the same collectives, and the
            # all-reduced finite check in apply_step skips the step everywhere
            finite = finite and bool(torch.isfinite(loss))
            self.engine.backward(loss, scale_wrt_gas=False)
            self._has_gradients = True
            self._vector = None
            total_loss += float(loss.detach())
        self._finite = self._finite and finite
        self._micro_batches += len(micro_batches)
        self._tokens += tokens
        return AccumulateStatistics(
            micro_batches=len(micro_batches),
            tokens=tokens,
            policy_tokens=policy_tokens,
            loss=total_loss,
            logprob_abs_diff_sum=abs_diff_sum,
            ratio_sum=ratio_sum,
            counted=counted,
            same_version_abs_diff_sum=same_sum,
            same_version_counted=same_counted,
            finite=finite,
        )

    def gradient_vector(self) -> torch.Tensor:
        """The accumulated gradient as one flat tensor (shape [P], P = total parameter count, the
        gradient dtype: fp32, or fp64 for a float64 model), in `model.parameters()` order; zeros
        where nothing was accumulated.

        Read through `deepspeed.utils.safe_get_full_grad`; at ZeRO stage 2 the accumulation is
        first finalised (as `step()` would), so follow this call with `zero_grad()` (a satellite
        sends, then zeroes) or `apply_step()`, not with more `accumulate`. A second call before
        the gradients change returns the same tensor (a retried send).
        """
        from deepspeed.utils import safe_get_full_grad

        if not self._has_gradients:  # nothing accumulated since the last step / zero_grad
            return torch.zeros(self.num_parameters, dtype=self._grad_dtype)
        if self._vector is not None:  # read already (a retried send): ZeRO 2 finalises only once
            return self._vector
        if self.config.zero_stage == 2:
            self.optimizer.finalize_gradient_accumulation_boundary()
        parts = []
        for p in self.model.parameters():
            if self.config.zero_stage == 2 or p.grad is not None:
                grad = safe_get_full_grad(p)
            else:
                grad = None  # stage 0/1 after zero_grad: no backward since, the gradient is 0
            parts.append(
                torch.zeros(p.numel(), dtype=self._grad_dtype) if grad is None else grad.reshape(-1)
            )
        self._vector = torch.cat(parts).to(self._grad_dtype)
        return self._vector

    @property
    def num_parameters(self) -> int:
        """P: the length of `gradient_vector()`."""
        return sum(p.numel() for p in self.model.parameters())

    @property
    def grad_dtype(self) -> torch.dtype:
        """dtype of `gradient_vector()` (fp32, or fp64 for a float64 model)."""
        return self._grad_dtype

    def add_gradient_vector(self, vec: torch.Tensor) -> None:
        """Add a flat gradient (shape [P], as `gradient_vector` returns) into DeepSpeed's
        accumulation, at any ZeRO stage 0-2, so that the next `apply_step` sees it.

        Done as one `engine.backward` of sum_i (p_i * g_i).sum(): d/dp of p.g is g, exactly (the
        autograd seed is 1 and each product's gradient is 1 * g), and DeepSpeed adds it to what
        it holds as for any micro-batch. Raises `ValueError` on a wrong shape or a non-float
        tensor; a non-finite entry makes the next `apply_step` skip.
        """
        if vec.dim() != 1 or vec.shape[0] != self.num_parameters or not vec.is_floating_point():
            raise ValueError(
                f"gradient vector of shape {tuple(vec.shape)} and dtype {vec.dtype}: "
                "expected a float "
                f"vector of {self.num_parameters} entries"
            )
        self.engine.train()
        terms = []
        offset = 0
        for p in self.model.parameters():
            n = p.numel()
            g = vec[offset : offset + n].view(p.shape).to(p.dtype)
            offset += n
            terms.append((p * g).sum())
        self.engine.backward(torch.stack(terms).sum(), scale_wrt_gas=False)
        self._has_gradients = True
        self._vector = None
        self._finite = self._finite and bool(torch.isfinite(vec).all())
        self._vectors_added += 1

    def apply_step(self, *, finite: bool = True) -> StepStatistics:
        """One optimizer step on what was accumulated, then `zero_grad()`.

        Skipped (weights, optimizer state and version unchanged; gradients zeroed) when a loss
        accumulated since the last step, the `finite` argument, or any gradient is non-finite on
        any rank of the trainer's own group.
        """
        finite = finite and self._finite and grads_finite(self.model.parameters())
        grad_norm = None
        if finite:
            self.engine.step()
            grad_norm = self.engine.get_global_grad_norm()
            grad_norm = None if grad_norm is None else float(grad_norm)
            self.version += 1
            self._steps_applied += 1
        else:
            self._steps_skipped += 1
            logger.warning(
                "non-finite loss or gradient: optimizer step skipped at version %d", self.version
            )
        self.zero_grad()
        return StepStatistics(version=self.version, applied=finite, grad_norm=grad_norm)

    def statistics(self) -> TrainerStatistics:
        """A snapshot of the trainer's counters (`TrainerStatistics`)."""
        return TrainerStatistics(
            version=self.version,
            has_gradients=self._has_gradients,
            num_parameters=self.num_parameters,
            steps_applied=self._steps_applied,
            steps_skipped=self._steps_skipped,
            micro_batches=self._micro_batches,
            tokens=self._tokens,
            gradient_vectors_added=self._vectors_added,
        )

    def zero_grad(self) -> None:
        """Drop the accumulated gradients (frees their memory: grads are set to None)."""
        self.engine.zero_grad()
        self._has_gradients = False
        self._finite = True
        self._vector = None

    def load_weights(self, snapshot_dir: str | Path, version: int) -> None:
        """Load a Hugging Face safetensors snapshot (as `save_snapshot` writes) into the module and
        tag it `version`. The optimizer state (and, at ZeRO 1-2, its master copy of the weights) is
        untouched: a satellite that loads snapshots computes gradients and never steps.

        Raises `FileNotFoundError` when the folder has no safetensors file, `ValueError` when a
        tensor's name or shape does not match the model, and refuses (`ValueError`) while
        gradients are held (they belong to the old weights).
        """
        from safetensors.torch import load_file

        if self._has_gradients:
            raise ValueError("load_weights while gradients are held: send or zero them first")
        files = sorted(Path(snapshot_dir).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors in snapshot {str(snapshot_dir)!r}")
        state = {}
        for f in files:
            state.update(load_file(f))
        params = dict(self.model.named_parameters())
        tied = getattr(self.model.config, "tie_word_embeddings", False)
        missing = [n for n in params if n not in state and not (tied and n == "lm_head.weight")]
        unknown = [n for n in state if n not in params]
        if missing or unknown:
            raise ValueError(
                f"snapshot {str(snapshot_dir)!r} does not match the model: missing {missing}, "
                f"unknown {unknown}"
            )
        with torch.no_grad():
            for name, p in params.items():
                if name not in state:
                    continue
                t = state[name]
                if t.shape != p.shape:
                    raise ValueError(
                        f"snapshot tensor {name!r} has shape {tuple(t.shape)}, "
                        f"the model {tuple(p.shape)}"
                    )
                p.copy_(t.to(p.dtype))
        self.version = version

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
        snapshots = sorted(
            (p for p in root.glob("v*") if p.name[1:].isdigit()), key=lambda p: int(p.name[1:])
        )
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
