"""ZeRO stage 3 for the trainer: parameters, gradients and optimizer state sharded over a group.

Owns `ZERO3_CONFIG` (the `zero_optimization` block) and `Zero3`, the stage-3 side of
`DeepSpeedTrainer`: one micro-batch's forward and backward (`backward_pass`), a pass that adds
nothing (`zero_pass`), this rank's gradient shard (`local_shard`, `add_local_shard`) and the
parameters gathered whole (`gathered`). Knows nothing about losses or batches: a pass runs the
caller's function.

Why not DeepSpeed's per-module hooks: they all-gather each module's parameters at its forward,
and the packed-tree forward runs `model.model` once per DFS chunk (a different count on each
rank) and reads `lm_head.weight` outside its module, so the ranks' collectives would not match.
The model is a ZeRO-3 *leaf* instead (`deepspeed.utils.set_z3_leaf_module`: no hooks inside),
and every pass on every rank is the same three collectives: one all-gather of all parameters
(`deepspeed.zero.GatheredParameters`), one reduce-scatter of the gradients in parameter order
(`reduce_ready_partitions_and_remove_grads`, as DeepSpeed's own leaf-module hook does), and
the bucket flush (`independent_gradient_partition_epilogue`). At rest a rank holds 1/k of the
parameters, gradients and Adam state; during a pass it holds the whole parameters (one wrap
unit, as FSDP with the whole model as one unit). Every rank must run the same number of passes
(`DeepSpeedTrainer.accumulate(..., passes=)`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from typing import TypeVar

import torch

__all__ = ["ZERO3_CONFIG", "Zero3"]

ZERO3_CONFIG = {
    "stage": 3,
    # every parameter sharded (DeepSpeed keeps parameters under 1e5 elements whole by default)
    "stage3_param_persistence_threshold": 0,
    # the reduce-scatter sorts by parameter id on this path, so every rank flattens alike
    "reduce_scatter": True,
}
"""DeepSpeed `zero_optimization` settings of a stage-3 trainer."""

T = TypeVar("T")


class Zero3:
    """The stage-3 passes of one trainer rank.

    Args:
        engine: the `deepspeed.DeepSpeedEngine` over a model marked a ZeRO-3 leaf.
        ranks: k, the size of the trainer's group; a pass's loss is multiplied by k, because
            DeepSpeed averages gradients over the group and the objective's losses add up.
    """

    def __init__(self, engine, ranks: int) -> None:
        self.engine = engine
        self.optimizer = engine.optimizer
        self.params = list(engine.module.parameters())
        self.ranks = ranks

    @staticmethod
    def numel(p: torch.nn.Parameter) -> int:
        """Elements of the whole parameter (its local data is a shard or empty)."""
        return int(getattr(p, "ds_numel", p.numel()))

    @staticmethod
    def shape(p: torch.nn.Parameter) -> torch.Size:
        """Shape of the whole parameter."""
        return torch.Size(getattr(p, "ds_shape", p.shape))

    @property
    def shard_numel(self) -> int:
        """Elements of this rank's gradient shard: the sum of its parameter partitions (the last
        rank's partitions are zero-padded to the same length)."""
        return sum(int(p.ds_tensor.numel()) for p in self.params)

    @contextmanager
    def gathered(self, modifier_rank: int | None = None):
        """All parameters whole on every rank for the block (a collective); with
        `modifier_rank`, that rank's values are broadcast and re-partitioned at the end."""
        import deepspeed

        with deepspeed.zero.GatheredParameters(self.params, modifier_rank=modifier_rank):
            yield

    def _reduce(self) -> None:
        for p in self.params:
            if p.grad is None:  # a parameter this pass did not reach: a zero gradient
                p.grad = torch.zeros_like(p)
            self.optimizer.reduce_ready_partitions_and_remove_grads(p)
        self.optimizer.independent_gradient_partition_epilogue()

    def backward_pass(
        self, forward: Callable[[], tuple[torch.Tensor, T]]
    ) -> tuple[torch.Tensor, T]:
        """Gather the parameters, run `forward()` (a scalar loss and anything else), backpropagate
        k x the loss and reduce-scatter the gradients into the shards, added to what earlier
        passes since the last `zero_grad` left. Returns what `forward` returned."""
        # the first pass after zero_grad overwrites the shards, later ones add (DeepSpeed
        # advances this counter in `engine.forward`, which the trainer does not call)
        self.optimizer.clear_backward_seen_flag()
        with self.gathered():
            loss, extra = forward()
            self.engine.backward(loss * self.ranks if self.ranks > 1 else loss, scale_wrt_gas=False)
            self._reduce()
        return loss, extra

    def zero_pass(self) -> None:
        """A pass that adds a zero gradient: the collectives of `backward_pass` with nothing to
        differentiate (a rank with fewer micro-batches than another)."""
        self.optimizer.clear_backward_seen_flag()
        with self.gathered():
            self._reduce()

    def local_shard(self) -> torch.Tensor:
        """This rank's gradient shard (float32 [shard_numel], on the trainer's device), in
        parameter order. Valid after a pass; the caller knows whether gradients are held."""
        from deepspeed.utils import safe_get_local_grad

        return torch.cat([safe_get_local_grad(p).reshape(-1) for p in self.params])

    def add_local_shard(self, shard: torch.Tensor) -> None:
        """Add `shard` (as `local_shard` returns it, from the same rank of another group of the
        same size) to this rank's gradient shard."""
        from deepspeed.utils import safe_get_local_grad, safe_set_local_grad

        offset = 0
        for p in self.params:
            current = safe_get_local_grad(p).reshape(-1)
            n = current.numel()
            safe_set_local_grad(p, current + shard[offset : offset + n].to(current.dtype))
            offset += n
