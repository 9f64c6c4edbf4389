"""The DeepSpeed trainer, and the guarded step: skip the update when any gradient is non-finite.

Owns `DeepSpeedTrainer` (the `gyre.engines.protocol.Trainer`: a Hugging Face causal LM under a
DeepSpeed ZeRO 0-3 engine, gloo on CPU, NCCL on GPU, with a torch AdamW client optimizer,
bit-identical to plain AdamW in fp32) and `grads_finite` / `step_if_finite`; re-exports DeepSpeed
start-up (`init_process_group`: `gyre.engines.ds_setup`). A step is `accumulate` (micro-batches
forward/backward; DeepSpeed's accumulation unmanaged) or `add_gradient_vector` /
`add_gradient_shard` (a satellite's gradient, added exactly), then `apply_step` (at the rate of
`gyre.engines.schedule`'s warm-up, whose position a checkpoint keeps). Its group is
torch.distributed's default group: one rank, or the k ranks of a multi-device cell at ZeRO-3
(`gyre.engines.zero3`; every rank runs every call). Blocking: call it from a worker thread. Knows
nothing about engines, HTTP, trees or the loss: a batch is a `MicroBatch`, its loss comes from the
caller's `Objective`; weight snapshots are Hugging Face folders vLLM reloads.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from gyre.config import TrainerConfig
from gyre.engines import ds_checkpoint
from gyre.engines.ds_setup import init_process_group
from gyre.engines.protocol import (
    AccumulateStatistics,
    MicroBatch,
    Objective,
    StepStatistics,
    TrainerStatistics,
    TrainStatistics,
    mismatch_split,
)
from gyre.engines.schedule import check_schedule, schedule_record, warmup_scheduler
from gyre.engines.zero3 import ZERO3_CONFIG, Zero3

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = [
    "DeepSpeedTrainer",
    "grads_finite",
    "step_if_finite",
    "init_process_group",
]

logger = logging.getLogger(__name__)


def grads_finite(params: Iterable[torch.nn.Parameter]) -> bool:
    """True when every existing `.grad` of `params` is finite, on this rank and (if
    torch.distributed is initialised) on every rank of the default group (an all-reduce of one
    int32 flag on the parameters' device, so every rank agrees to step or to skip)."""
    ok = True
    device = None
    for p in params:
        device = p.device
        if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
            ok = False
            break
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
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
        if dtype == torch.float64 and (
            config.zero_stage != 0 or torch.distributed.get_world_size() != 1
        ):
            # DeepSpeed has no float64 path: its all-reduce asserts on fp64 grads (ZeRO 0), its
            # ZeRO 1-2 partitions give wrong updates and ZeRO-3 asserts on the dtype. On one rank
            # that all-reduce is a no-op, so float64 (exactness tests) runs ZeRO 0 on a one-rank
            # group without it.
            raise ValueError(
                "dtype='float64' needs zero_stage=0 on a one-rank group, "
                f"got zero_stage={config.zero_stage}, "
                f"world size {torch.distributed.get_world_size()}"
            )
        if config.zero_stage == 3:
            from deepspeed.utils import set_z3_leaf_module

            set_z3_leaf_module(model, True)  # no per-module hooks: `gyre.engines.zero3`
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=config.learning_rate,
            betas=(config.adam_beta1, config.adam_beta2),
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )
        ds_config = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "managed_gradient_accumulation": False,
            "zero_optimization": dict(ZERO3_CONFIG)
            if config.zero_stage == 3
            else {"stage": config.zero_stage},
            "zero_allow_untested_optimizer": True,
            "gradient_clipping": config.grad_clip,
            "bf16": {"enabled": dtype == torch.bfloat16},
            "steps_per_print": 2**31 - 1,
        }
        # DeepSpeed steps it with each applied optimizer step (not a skipped one)
        self._scheduler = warmup_scheduler(optimizer, config.warmup_steps)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=ds_config, lr_scheduler=self._scheduler
        )
        if dtype == torch.float64:
            self.engine.enable_backward_allreduce = False
        self.ranks = torch.distributed.get_world_size()
        """k: the ranks of the trainer's group (a cell's devices); each call runs on all."""
        self.topology = ds_checkpoint.topology_of(self.engine.module, self.ranks, config)
        self.rank = torch.distributed.get_rank()
        self.device = self.engine.device
        """The parameters' device (the rank's local device on GPU)."""
        self._zero3 = Zero3(self.engine, self.ranks) if config.zero_stage == 3 else None
        self.config = config
        self.objective = objective
        self.version = version
        self._grad_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        self._has_gradients = False
        self._vector: torch.Tensor | None = None  # the last gradient_vector() until grads change
        self._finite = True  # every loss and added vector since the last step was finite
        self._steps_applied = self._steps_skipped = self._vectors_added = 0
        self._micro_batches = self._tokens = 0

    @property
    def model(self) -> PreTrainedModel:
        """The Hugging Face model (full parameters at ZeRO stages 0-2; at ZeRO-3 each holds an
        empty tensor outside a pass: `gyre.engines.zero3`)."""
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
        self,
        micro_batches: Sequence[MicroBatch],
        advantages: Mapping[str, float | None],
        *,
        passes: int | None = None,
    ) -> AccumulateStatistics:
        """Forward/backward every micro-batch under the objective, adding its gradient to the
        accumulation; no step.

        The objective's losses already normalise per execution and per batch (the policy loss's
        weights do), so the gradients of a batch's micro-batches simply add up, on one trainer or
        spread over several (over k ranks, each loss is multiplied by k: DeepSpeed averages over
        its group). `passes` (ZeRO-3 on several ranks: each rank runs this rank's share) is how
        many passes to run, at least `len(micro_batches)`: the rest add a zero gradient, so every
        rank runs the same collectives. Raises `ValueError` for no micro-batches and no `passes`,
        `passes` below the micro-batches or (not ZeRO-3) above them, or an execution without an
        advantage (checked for every micro-batch before any backward: a refused call adds
        nothing).
        """
        if not micro_batches and passes is None:
            raise ValueError("accumulate needs at least one micro-batch")
        passes = len(micro_batches) if passes is None else passes
        if passes < max(len(micro_batches), 1):
            raise ValueError(
                f"passes={passes} must be >= 1 and >= the {len(micro_batches)} micro-batches"
            )
        if passes > len(micro_batches) and self._zero3 is None:
            raise ValueError(f"passes={passes} > {len(micro_batches)} micro-batches needs ZeRO-3")
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

            def forward(batch=batch):
                return self.objective(
                    self.model,
                    batch,
                    advantages,
                    version=self.version,
                    attention=self.config.attention,
                    logprob_impl=self.config.logprob_impl,
                )

            if self._zero3 is not None:
                loss, stats = self._zero3.backward_pass(forward)
            else:
                loss, stats = forward()
                scaled = loss * self.ranks if self.ranks > 1 else loss
                self.engine.backward(scaled, scale_wrt_gas=False)
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
            self._has_gradients = True
            self._vector = None
            total_loss += float(loss.detach())
        for _ in range(passes - len(micro_batches)):
            assert self._zero3 is not None  # more passes than micro-batches: checked above
            self._zero3.zero_pass()
            self._has_gradients = True  # zeros: the same on every rank
            self._vector = None
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
        gradient dtype: fp32, or fp64 for a float64 model, on the parameters' device), in
        `model.parameters()` order; zeros where nothing was accumulated.

        Read through `deepspeed.utils.safe_get_full_grad` (at ZeRO-3 an all-gather of the
        shards: every rank calls it); at ZeRO stage 2 the accumulation is first finalised (as
        `step()` would), so follow this call with `zero_grad()` (a satellite sends, then zeroes)
        or `apply_step()`, not with more `accumulate`. A second call before the gradients change
        returns the same tensor (a retried send).
        """
        from deepspeed.utils import safe_get_full_grad

        if not self._has_gradients:  # nothing accumulated since the last step / zero_grad
            return torch.zeros(self.num_parameters, dtype=self._grad_dtype, device=self.device)
        if self._vector is not None:  # read already (a retried send): ZeRO 2 finalises only once
            return self._vector
        if self.config.zero_stage == 2:
            self.optimizer.finalize_gradient_accumulation_boundary()
        parts = []
        for p in self.model.parameters():
            if self.config.zero_stage in (2, 3) or p.grad is not None:
                grad = safe_get_full_grad(p)
            else:
                grad = None  # stage 0/1 after zero_grad: no backward since, the gradient is 0
            if grad is None:
                grad = torch.zeros(Zero3.numel(p), dtype=self._grad_dtype, device=self.device)
            parts.append(grad.reshape(-1).to(self.device, self._grad_dtype))
        self._vector = torch.cat(parts)
        return self._vector

    @property
    def num_parameters(self) -> int:
        """P: the length of `gradient_vector()` (whole parameters, also when sharded)."""
        return sum(Zero3.numel(p) for p in self.model.parameters())

    @property
    def grad_dtype(self) -> torch.dtype:
        """dtype of `gradient_vector()` and `gradient_shard()` (fp32, or fp64 for a float64
        model)."""
        return self._grad_dtype

    @property
    def shard_numel(self) -> int:
        """Length of `gradient_shard()`: this rank's partitions at ZeRO-3 (about P / k), else P."""
        return self.num_parameters if self._zero3 is None else self._zero3.shard_numel

    def gradient_shard(self) -> torch.Tensor:
        """This rank's part of the accumulated gradient (shape [shard_numel], `grad_dtype`, on
        the parameters' device): at ZeRO-3 its partition of every parameter in parameter order,
        the same layout on rank r of every group of k ranks over the same model (what the
        core/satellite exchange moves, rank r to rank r); else `gradient_vector()`. Zeros when
        nothing is held."""
        if self._zero3 is None:
            return self.gradient_vector()
        if not self._has_gradients:
            return torch.zeros(self.shard_numel, dtype=self._grad_dtype, device=self.device)
        return self._zero3.local_shard().to(self._grad_dtype)

    def add_gradient_shard(self, shard: torch.Tensor) -> None:
        """Add rank r's `gradient_shard()` of another trainer of the same model and group size
        (moved to this trainer's device first) to this rank's accumulation; the next
        `apply_step` sees it. Every rank of the group calls it (ZeRO-3: with nothing held, a
        zero pass first). Raises `ValueError` on a wrong shape or a non-float tensor; a
        non-finite entry makes the next `apply_step` skip."""
        if self._zero3 is None:
            self.add_gradient_vector(shard)
            return
        if shard.dim() != 1 or shard.shape[0] != self.shard_numel or not shard.is_floating_point():
            raise ValueError(
                f"gradient shard of shape {tuple(shard.shape)} and dtype {shard.dtype}: "
                f"expected a float vector of {self.shard_numel} entries"
            )
        shard = shard.to(self.device)
        if not self._has_gradients:
            self._zero3.zero_pass()  # the shards are zero and later passes add to them
        self._zero3.add_local_shard(shard)
        self._has_gradients = True
        self._vector = None
        self._finite = self._finite and bool(torch.isfinite(shard).all())
        self._vectors_added += 1

    def add_gradient_vector(self, vec: torch.Tensor) -> None:
        """Add a flat gradient (shape [P], as `gradient_vector` returns; moved to the parameters'
        device first) into DeepSpeed's accumulation, at any ZeRO stage, so that the next
        `apply_step` sees it. On k ranks, every rank adds the same vector.

        Stages 0-2: one `engine.backward` of sum_i (p_i * g_i).sum(): d/dp of p.g is g, exactly
        (the autograd seed is 1 and each product's gradient is 1 * g), and DeepSpeed adds it to
        what it holds as for any micro-batch (averaging k equal copies). ZeRO-3: this rank's
        partition of each parameter's slice, added to its shard. Raises `ValueError` on a wrong
        shape or a non-float tensor; a non-finite entry makes the next `apply_step` skip.
        """
        if vec.dim() != 1 or vec.shape[0] != self.num_parameters or not vec.is_floating_point():
            raise ValueError(
                f"gradient vector of shape {tuple(vec.shape)} and dtype {vec.dtype}: "
                f"expected a float vector of {self.num_parameters} entries"
            )
        vec = vec.to(self.device)
        if self._zero3 is not None:
            self.add_gradient_shard(self._shard_of(vec))
            return
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

    def _shard_of(self, vec: torch.Tensor) -> torch.Tensor:
        """ZeRO-3: this rank's partition of each parameter's slice of a whole flat vector,
        zero-padded as DeepSpeed pads the last partition."""
        assert self._zero3 is not None  # called at ZeRO-3 only
        parts, offset = [], 0
        for p in self._zero3.params:  # the model's parameters, as DeepSpeed partitioned them
            n, part = Zero3.numel(p), int(p.ds_tensor.numel())
            flat = vec[offset : offset + n]
            offset += n
            piece = flat[self.rank * part : (self.rank + 1) * part]
            parts.append(torch.nn.functional.pad(piece, (0, part - piece.numel())))
        return torch.cat(parts)

    def optimizer_state_numel(self) -> int:
        """Elements of optimizer state this rank holds (Adam's two moments: 2 x its parameter
        shard; 2P on one rank or below ZeRO-1)."""
        inner = getattr(self.optimizer, "optimizer", self.optimizer)
        return sum(
            int(t.numel())
            for state in inner.state.values()
            for t in state.values()
            if isinstance(t, torch.Tensor) and t.dim() > 0
        )

    def apply_step(self, *, finite: bool = True) -> StepStatistics:
        """One optimizer step on what was accumulated, then `zero_grad()`.

        Skipped (weights, optimizer state and version unchanged; gradients zeroed) when a loss
        accumulated since the last step, the `finite` argument, or any gradient is non-finite on
        any rank of the trainer's own group (at ZeRO-2, where DeepSpeed holds the gradients, when
        it skips the update for an inf or NaN gradient norm)."""
        if self._zero3 is None:
            finite = finite and self._finite and grads_finite(self.model.parameters())
        else:  # the gradients live in the shards: all-reduce of this rank's verdict
            ok = finite and self._finite and bool(torch.isfinite(self.gradient_shard()).all())
            flag = torch.tensor([int(ok)], dtype=torch.int32, device=self.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
            finite = bool(flag.item())
        if finite:
            skipped = self.engine.skipped_steps
            self.engine.step()
            finite = self.engine.skipped_steps == skipped
        grad_norm = self.engine.get_global_grad_norm() if finite else None
        grad_norm = None if grad_norm is None else float(grad_norm)
        if finite:
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
        """Drop the accumulated gradients (frees their memory: grads are set to None; at ZeRO-3
        the next pass overwrites the shards instead of adding to them)."""
        self.engine.zero_grad()
        if self._zero3 is not None:
            self.optimizer.zero_grad()  # the engine's only drops `.grad`s
        self._has_gradients = False
        self._finite = True
        self._vector = None

    def load_weights(self, snapshot_dir: str | Path, version: int) -> None:
        """Load a Hugging Face safetensors snapshot (as `save_snapshot` writes) into the module and
        tag it `version` (every rank reads the files; at ZeRO-3 rank 0's copy is partitioned to
        all). The optimizer state (and, at ZeRO 1-3, its master copy of the weights) is
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
        for name, p in params.items():
            if name in state and state[name].shape != Zero3.shape(p):
                raise ValueError(
                    f"snapshot tensor {name!r} has shape {tuple(state[name].shape)}, "
                    f"the model {tuple(Zero3.shape(p))}"
                )
        # ZeRO-3: gathered whole, rank 0's copy re-partitioned to every rank (a collective)
        gathered = nullcontext() if self._zero3 is None else self._zero3.gathered(modifier_rank=0)
        with gathered, torch.no_grad():
            for name, p in params.items():
                if name in state:
                    p.copy_(state[name].to(p.device, p.dtype))
        self.version = version

    def save_snapshot(self, root: str | Path) -> Path:
        """Write the current weights as `root/v<version>` (Hugging Face folder, safetensors) for the
        engines; keeps the newest `keep_snapshots` and deletes older ones. Returns the folder."""
        root = Path(root)
        path = root / f"v{self.version}"
        if self._zero3 is not None:  # every rank gathers the parameters, rank 0 writes them
            with self._zero3.gathered():
                if self.rank == 0:
                    self._write_snapshot(root, path)
        else:
            self._write_snapshot(root, path)
        return path

    def _write_snapshot(self, root: Path, path: Path) -> None:
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

    def save_checkpoint(self, path: str | Path) -> None:
        """Weights, optimizer state, version and learning-rate schedule (`schedule_record`) at
        `path`, with the topology they were written at (`gyre.engines.ds_checkpoint.save`)."""
        state = {"version": self.version, "schedule": schedule_record(self.config, self._scheduler)}
        ds_checkpoint.save(self.engine, path, state, self.topology, write=self.rank == 0)

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore what `save_checkpoint` wrote, or its universal conversion at any rank count
        (`gyre.engines.ds_checkpoint.load`). Raises `FileNotFoundError` if there is none,
        `ValueError` if it was trained at another `learning_rate` or `warmup_steps`, and
        `TopologyError` if it does not load on this trainer's topology as it is."""
        client_state = ds_checkpoint.load(self.engine, path, self.topology)
        record = client_state.get("schedule")
        check_schedule(self.config, record, str(path))
        if self._scheduler is not None and record is not None:  # None: refused just above
            self._scheduler.load_state_dict(record["scheduler"])
        self.version = int(client_state["version"])
