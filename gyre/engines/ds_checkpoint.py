"""What a trainer checkpoint was written at, and its conversion to another rank count.

Owns `save` / `load` (a trainer's DeepSpeed checkpoint), `CheckpointTopology` (the ranks, ZeRO
stage, dtype and parameter shapes of the trainer that wrote one: `topology_of`), kept beside
DeepSpeed's files as `topology.json` (`write_topology` on save, `read_topology` without torch),
`load_plan` (the one rule of what loads where: as written on the same topology; through
DeepSpeed's universal checkpoint when only the rank count changed, at ZeRO-3; not at all on
another ZeRO stage, dtype or model), `to_universal` (`deepspeed.checkpoint.ds_to_universal` in a
subprocess, written whole or not at all), `is_universal`, `universal_available` and
`model_shapes` (a model folder's parameter shapes, built on torch's meta device). Knows nothing
about runs, config keys or cells.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import msgspec

from gyre.config import TrainerConfig

__all__ = [
    "TAG",
    "TOPOLOGY_FILE",
    "UNIVERSAL_MARKER",
    "CheckpointTopology",
    "TopologyError",
    "topology_of",
    "load_plan",
    "save",
    "load",
    "write_topology",
    "read_topology",
    "is_universal",
    "universal_available",
    "to_universal",
    "model_shapes",
]

TAG = "state"
"""The tag a trainer saves under: its files are in `<folder>/state/`."""
TOPOLOGY_FILE = "topology.json"
"""The trainer's record beside DeepSpeed's files in its checkpoint folder."""
UNIVERSAL_MARKER = "latest_universal"
"""The file `ds_to_universal` writes at the root of a universal checkpoint (its tag inside)."""


class CheckpointTopology(msgspec.Struct, frozen=True, kw_only=True):
    """The trainer that wrote a checkpoint, as far as DeepSpeed's loading depends on it."""

    ranks: int
    """k: the ranks of its group, DeepSpeed's DP world size (a cell's devices)."""
    zero_stage: int
    dtype: str
    """Training dtype (`TrainerConfig.dtype`)."""
    parameters: dict[str, list[int]] = {}
    """Each parameter's whole shape by name (as `named_parameters` gives them)."""


def topology_of(model, ranks: int, config: TrainerConfig) -> CheckpointTopology:
    """The topology of a trainer of `model` (its parameters whole or ZeRO-3 shards) over
    `ranks` ranks, trained as `config` says."""
    return CheckpointTopology(
        ranks=ranks,
        zero_stage=config.zero_stage,
        dtype=config.dtype,
        parameters={n: list(getattr(p, "ds_shape", p.shape)) for n, p in model.named_parameters()},
    )


class TopologyError(ValueError):
    """A checkpoint that does not load on a topology, converted or not: `fields` are the
    `CheckpointTopology` fields that block it."""

    def __init__(self, message: str, fields: tuple[str, ...]) -> None:
        super().__init__(message)
        self.fields = fields


def load_plan(
    saved: CheckpointTopology, now: CheckpointTopology
) -> Literal["as_written", "universal"]:
    """How a checkpoint written at `saved` loads into a trainer at `now`: "as_written", or
    "universal" (converted by `to_universal`; DeepSpeed's ZeRO-3 shards are per rank and its
    loader refuses another DP world size). `now.parameters` empty: not compared. Raises
    `TopologyError` naming what blocks it: another ZeRO stage or dtype (DeepSpeed's files differ
    per stage, and the optimizer state per dtype), other parameters (another model), another rank
    count below ZeRO-3 (one rank only)."""
    blocked = [f for f in ("zero_stage", "dtype") if getattr(saved, f) != getattr(now, f)]
    if now.parameters and saved.parameters and saved.parameters != now.parameters:
        blocked.append("parameters")
    if not blocked and saved.ranks != now.ranks and saved.zero_stage != 3:
        blocked.append("ranks")
    if blocked:
        raise TopologyError(
            f"a checkpoint written at {_describe(saved)} does not load at {_describe(now)}",
            tuple(blocked),
        )
    return "as_written" if saved.ranks == now.ranks else "universal"


def _describe(t: CheckpointTopology) -> str:
    return f"{t.ranks} ranks, ZeRO stage {t.zero_stage}, {t.dtype}"


def save(
    engine,
    path: str | Path,
    client_state: dict[str, Any],
    topology: CheckpointTopology,
    *,
    write: bool,
) -> None:
    """Save DeepSpeed `engine` (every rank of its group calls it) at `path` under the tag
    `TAG`, with `client_state`; the rank that `write`s (one) adds `topology` beside it."""
    engine.save_checkpoint(str(path), tag=TAG, client_state=client_state)
    if write:
        write_topology(path, topology)


def load(engine, path: str | Path, topology: CheckpointTopology) -> dict[str, Any]:
    """Load what `save` wrote at `path`, or its universal conversion (`to_universal`), into
    DeepSpeed `engine` at `topology`; returns the checkpoint's client state. Raises
    `TopologyError` before DeepSpeed reads a file when the record says it does not load here as
    it is (`load_plan`; a universal conversion keeps its source's record), and
    `FileNotFoundError` when `path` holds no checkpoint."""
    universal = is_universal(path)
    saved = read_topology(path)
    if saved is not None and load_plan(saved, topology) == "universal" and not universal:
        raise TopologyError(
            f"checkpoint {str(path)!r} was written at {saved.ranks} ranks and this trainer has "
            f"{topology.ranks}: DeepSpeed loads it only converted (`to_universal`)",
            ("ranks",),
        )
    ds_config = engine._config  # DeepSpeed reads the switch only while loading
    ds_config.load_universal_checkpoint = universal
    try:
        load_path, client_state = engine.load_checkpoint(
            str(path), tag=TAG, load_lr_scheduler_states=False
        )
    finally:
        ds_config.load_universal_checkpoint = False
    if load_path is None:
        raise FileNotFoundError(f"no DeepSpeed checkpoint under {str(path)!r}")
    return client_state


def write_topology(folder: str | Path, topology: CheckpointTopology) -> None:
    """Write `topology` as `folder/topology.json` (atomically)."""
    path = Path(folder) / TOPOLOGY_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(msgspec.json.encode(topology))
    os.replace(tmp, path)


def read_topology(folder: str | Path) -> CheckpointTopology | None:
    """The record in `folder` (None: a checkpoint of a gyre that wrote none). Raises
    `msgspec.DecodeError` for a file that is not one."""
    path = Path(folder) / TOPOLOGY_FILE
    if not path.exists():
        return None
    return msgspec.json.decode(path.read_bytes(), type=CheckpointTopology)


def is_universal(folder: str | Path) -> bool:
    """Whether `folder` holds a universal checkpoint (`to_universal`'s output)."""
    return (Path(folder) / UNIVERSAL_MARKER).is_file()


def universal_available() -> bool:
    """Whether the installed DeepSpeed has `deepspeed.checkpoint.ds_to_universal` (found
    without importing DeepSpeed)."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(
        (Path(p) / "checkpoint" / "ds_to_universal.py").is_file()
        for p in spec.submodule_search_locations
    )


def to_universal(src: str | Path, dst: str | Path, *, tag: str = TAG, workers: int = 1) -> None:
    """Convert the DeepSpeed checkpoint `src` (its tag `tag`) into a universal checkpoint at
    `dst` (`dst/<tag>/`, `dst/latest_universal`), which DeepSpeed loads at any rank count:
    DeepSpeed's own converter, `python -m deepspeed.checkpoint.ds_to_universal`, run in a
    subprocess with `workers` extract and merge processes. Written under `dst.tmp` and renamed,
    so a kill mid-way leaves no `dst`. Raises `RuntimeError` with the converter's last output
    when it fails."""
    src, dst = Path(src), Path(dst)
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "deepspeed.checkpoint.ds_to_universal",
            "--input_folder",
            str(src / tag),
            "--output_folder",
            str(tmp / tag),
            "--num_extract_workers",
            str(workers),
            "--num_merge_workers",
            str(workers),
        ],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0 or not is_universal(tmp):
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(
            f"converting the DeepSpeed checkpoint {str(src)!r} to a universal checkpoint failed "
            f"(exit status {result.returncode}): {tail[0]}"
        )
    if (src / TOPOLOGY_FILE).exists():  # the record of what it was converted from
        shutil.copy2(src / TOPOLOGY_FILE, tmp / TOPOLOGY_FILE)
    shutil.rmtree(dst, ignore_errors=True)
    os.replace(tmp, dst)


def model_shapes(model_dir: str | Path) -> dict[str, list[int]]:
    """Each parameter's shape by name of the causal LM in `model_dir` (its `config.json`), as a
    trainer built on it names them: the model is built on torch's meta device (no weights read,
    no memory)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return {name: list(p.shape) for name, p in model.named_parameters()}
