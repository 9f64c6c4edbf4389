"""The trainer side of a step checkpoint, held to the run that resumes it.

Owns the layout of a checkpoint's `trainer/` folder (`TRAINER_DIR`: the core cell's DeepSpeed
checkpoint with the topology it was written at, `gyre.engines.ds_checkpoint`; `WEIGHTS_DIR`: the
published weights) and of its conversion beside it (`UNIVERSAL_DIR`: `step-<k>/universal/`,
outside `trainer/` and its sha256 manifest), `check_trainer_checkpoint` (the preflight of a
resume: that topology against this run's `cells.devices_per_cell`, `trainer.zero_stage`,
`trainer.dtype` and model; it loads as written, is converted, or is refused in one line naming
the keys with the checkpoint's values and the run's) and `checkpoint_to_load` (the folder the core
loads, converted once when only the rank count changed). Knows nothing about cells or the loop.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from gyre.config import RunConfig
from gyre.engines.ds_checkpoint import (
    CheckpointTopology,
    TopologyError,
    is_universal,
    load_plan,
    model_shapes,
    read_topology,
    to_universal,
    universal_available,
)
from gyre.errors import ConfigError

__all__ = [
    "TRAINER_DIR",
    "WEIGHTS_DIR",
    "UNIVERSAL_DIR",
    "check_trainer_checkpoint",
    "checkpoint_to_load",
]

TRAINER_DIR = "deepspeed"
"""The core trainer's DeepSpeed checkpoint, inside a checkpoint's `trainer/`."""
WEIGHTS_DIR = "weights"
"""The published weights (a Hugging Face folder), inside a checkpoint's `trainer/`."""
UNIVERSAL_DIR = "universal"
"""`TRAINER_DIR` converted to DeepSpeed's universal checkpoint, beside `trainer/`."""


def check_trainer_checkpoint(
    config: RunConfig, trainer_dir: Path, *, model_dir: Path | None = None
) -> Literal["as_written", "universal"]:
    """How the core cell of a run with `config` loads the checkpoint whose `trainer/` folder is
    `trainer_dir` (`gyre.engines.ds_checkpoint.load_plan`): "as_written", or "universal" (another
    `cells.devices_per_cell` at ZeRO-3: `checkpoint_to_load` converts it). `model_dir` (the run's
    model folder, when there is one yet) is held to the checkpoint's parameter shapes. A
    checkpoint of a gyre that recorded no topology loads as written.

    Raises `ConfigError`, one line naming `cells.devices_per_cell` and `trainer.zero_stage` (and
    `trainer.dtype`, `model.path` when they block it) with the checkpoint's values and this
    run's, and what to do: when it was written at another ZeRO stage, dtype or model, or needs a
    conversion this DeepSpeed cannot do."""
    folder = trainer_dir / TRAINER_DIR
    saved = read_topology(folder)
    if saved is None:
        return "as_written"
    now = CheckpointTopology(
        ranks=config.cells.devices_per_cell,
        zero_stage=config.trainer.zero_stage,
        dtype=config.trainer.dtype,
        parameters=model_shapes(model_dir) if model_dir is not None else {},
    )
    try:
        plan = load_plan(saved, now)
    except TopologyError as exc:
        raise ConfigError(_refusal(trainer_dir.parent, saved, now, exc.fields, config)) from None
    if plan == "universal" and not (
        universal_available() or is_universal(trainer_dir.parent / UNIVERSAL_DIR)
    ):
        raise ConfigError(
            f"{_written(trainer_dir.parent, saved, now, ())}. Converting it to another "
            "cells.devices_per_cell needs DeepSpeed's universal checkpoint "
            "(deepspeed.checkpoint.ds_to_universal, DeepSpeed >= 0.19.8), which this DeepSpeed "
            f"lacks: resume with cells.devices_per_cell = {saved.ranks}, or install it"
        )
    return plan


def checkpoint_to_load(config: RunConfig, trainer_dir: Path) -> Path:
    """The DeepSpeed folder the core cell of a run with `config` loads from the checkpoint whose
    `trainer/` folder is `trainer_dir`: its `TRAINER_DIR` as written, or, when the rank count
    changed (`check_trainer_checkpoint`), its universal conversion `UNIVERSAL_DIR` beside
    `trainer/`, converted here once (blocking; a later resume reuses it). Raises `ConfigError`
    as `check_trainer_checkpoint` does, `RuntimeError` when the conversion fails."""
    if check_trainer_checkpoint(config, trainer_dir) == "as_written":
        return trainer_dir / TRAINER_DIR
    universal = trainer_dir.parent / UNIVERSAL_DIR
    if not is_universal(universal):
        workers = max(1, min(4, (os.cpu_count() or 1) // 2))
        to_universal(trainer_dir / TRAINER_DIR, universal, workers=workers)
    return universal


def _written(
    folder: Path, saved: CheckpointTopology, now: CheckpointTopology, fields: tuple[str, ...]
) -> str:
    """'checkpoint F was written at <keys = saved>; this run has <keys = now>'."""

    def keys(t: CheckpointTopology) -> str:
        out = f"cells.devices_per_cell = {t.ranks} with trainer.zero_stage = {t.zero_stage}"
        return out + (f" and trainer.dtype = {t.dtype!r}" if "dtype" in fields else "")

    return f"checkpoint {str(folder)!r} was written at {keys(saved)}; this run has {keys(now)}"


def _refusal(
    folder: Path,
    saved: CheckpointTopology,
    now: CheckpointTopology,
    fields: tuple[str, ...],
    config: RunConfig,
) -> str:
    """The one-line refusal of a checkpoint that does not load on `now` (`fields` block it)."""
    text = _written(folder, saved, now, fields)
    fixes = [f"trainer.{f} = {getattr(saved, f)!r}" for f in ("zero_stage", "dtype") if f in fields]
    if "parameters" in fields:
        names = sorted(saved.parameters.keys() | now.parameters.keys())
        differ = [n for n in names if saved.parameters.get(n) != now.parameters.get(n)]
        first = differ[0]
        text += (
            f", and model.path = {config.model.path!r}, whose parameter {first} is "
            f"{now.parameters.get(first, 'missing')} where the checkpoint's is "
            f"{saved.parameters.get(first, 'missing')} ({len(differ)} parameters differ)"
        )
        fixes.append("the run's own model.path")
    if "ranks" in fields:  # below ZeRO-3 a cell has one rank: no config reaches this
        fixes.append(f"cells.devices_per_cell = {saved.ranks}")
    return (
        f"{text}. DeepSpeed loads a checkpoint only at the ZeRO stage, dtype and model it was "
        "written at (another cells.devices_per_cell alone is converted at trainer.zero_stage = "
        f"3): resume with {' and '.join(fixes)}, or start a new run_dir"
    )
