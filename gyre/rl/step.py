"""The guarded optimizer step: skip the update everywhere when any gradient is non-finite.

Owns `grads_finite` and `step_if_finite`. A non-finite loss on one micro-batch poisons the
accumulated gradients; instead of applying them, every rank agrees (an all-reduce of one flag
when torch.distributed is initialised) to zero the gradients and skip the step, so the weights
and optimizer state stay as they were. Knows nothing about losses or trees.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["grads_finite", "step_if_finite"]


def grads_finite(params: Iterable[torch.nn.Parameter]) -> bool:
    """True when every existing `.grad` of `params` is finite, on this rank and (if
    torch.distributed is initialised) on every rank of the default group."""
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
    """Apply `optimizer.step()` if every gradient of its parameters is finite; zero the
    gradients either way. Returns True when the step was applied, False when it was skipped."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    ok = grads_finite(params)
    if ok:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return ok
