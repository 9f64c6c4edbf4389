"""The learning-rate schedule of a trainer: a linear warm-up, and its record in a checkpoint.

Owns `warmup_scheduler` (torch's `LinearLR` for `TrainerConfig.warmup_steps`; the DeepSpeed
trainer and `benchmarks/replay_learning.py` step it once per applied optimizer step) and
`schedule_record` / `check_schedule` (what a checkpoint keeps of the schedule, and the refusal of
a resume whose config trains at another rate: the optimizer state restores the checkpoint's rate,
so a changed `learning_rate` or `warmup_steps` would otherwise be quietly ignored).
"""

from __future__ import annotations

from typing import Any

import torch

from gyre.config import TrainerConfig

__all__ = ["warmup_scheduler", "schedule_record", "check_schedule"]


def warmup_scheduler(
    optimizer: torch.optim.Optimizer, warmup_steps: int
) -> torch.optim.lr_scheduler.LinearLR | None:
    """Step k (1-based) of `optimizer` at `lr * min(1, k / warmup_steps)` once the returned
    scheduler is stepped after each step (torch's `LinearLR` from 1/warmup_steps to 1 over
    warmup_steps - 1 steps; `TrainerConfig.warmup_steps` gives the source); None (the full rate
    throughout) for 0 or 1."""
    if warmup_steps <= 1:
        return None
    return torch.optim.lr_scheduler.LinearLR(
        optimizer, start_factor=1 / warmup_steps, total_iters=warmup_steps - 1
    )


def schedule_record(
    config: TrainerConfig, scheduler: torch.optim.lr_scheduler.LRScheduler | None
) -> dict[str, Any]:
    """What a checkpoint keeps of the schedule: the rate, the warm-up and the scheduler's state."""
    return {
        "learning_rate": config.learning_rate,
        "warmup_steps": config.warmup_steps,
        "scheduler": None if scheduler is None else scheduler.state_dict(),
    }


def check_schedule(config: TrainerConfig, record: dict[str, Any] | None, where: str) -> None:
    """Raise `ValueError` when the checkpoint at `where` was trained with another
    `learning_rate` or `warmup_steps` than `config` (`record`: `schedule_record`'s; None for a
    checkpoint written before it existed, taken as no warm-up at an unrecorded rate)."""
    saved = record or {"learning_rate": None, "warmup_steps": 0}
    now = {"learning_rate": config.learning_rate, "warmup_steps": config.warmup_steps}
    same_warmup = max(saved["warmup_steps"], 1) == max(now["warmup_steps"], 1)  # 0 and 1: none
    same_rate = saved["learning_rate"] in (None, now["learning_rate"])
    if not (same_warmup and same_rate):
        raise ValueError(
            f"the checkpoint at {where} was trained with trainer.learning_rate="
            f"{saved['learning_rate']} and trainer.warmup_steps={saved['warmup_steps']}, the "
            f"config says {now['learning_rate']} and {now['warmup_steps']}: a resume keeps the "
            "checkpoint's schedule (start a new run from its weights to change it)"
        )
