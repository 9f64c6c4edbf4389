"""DeepSpeed start-up: the torch.distributed group a trainer runs in, and DeepSpeed's JIT ops.

Owns `init_process_group` (a one-rank group, a launcher's, or a cell's group of k ranks),
`prepare_extensions_dir`, `build_ops` and `STALE_BUILD_LOCK_S`. Knows nothing about models,
trainers or cells.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from pathlib import Path

import torch

__all__ = ["init_process_group", "prepare_extensions_dir", "build_ops", "STALE_BUILD_LOCK_S"]

logger = logging.getLogger(__name__)


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


def init_process_group(
    *, rank: int = 0, world_size: int = 1, init_method: str | None = None
) -> None:
    """Join (or form) torch.distributed for DeepSpeed: from RANK/WORLD_SIZE/MASTER_* when a
    launcher set them; else rank `rank` of `world_size` at `init_method` ("tcp://HOST:PORT", a
    cell's own group: `gyre.runtime.cell_ranks`); else a one-process group on a free loopback
    port. A no-op for the group when one is initialised. On GPU the rank's device is
    `cuda:LOCAL_RANK` (the cell's processes see only the cell's devices). No rendezvous variable
    is written to the environment, so child processes (agents, other nodes) never inherit a stale
    one (only LOCAL_RANK, which DeepSpeed requires: `rank` unless set, and TORCH_EXTENSIONS_DIR:
    `prepare_extensions_dir`). Raises `ValueError` for a bad rank or a group of several ranks
    without `init_method`."""
    prepare_extensions_dir()
    import deepspeed

    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    if world_size > 1 and init_method is None:
        raise ValueError(f"a group of world_size={world_size} ranks needs init_method")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    os.environ.setdefault("LOCAL_RANK", str(rank))  # DeepSpeed's engine asserts it
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    if not torch.distributed.is_initialized() and "WORLD_SIZE" not in os.environ:
        torch.distributed.init_process_group(
            backend,
            init_method=init_method or f"tcp://127.0.0.1:{_free_port()}",
            rank=rank,
            world_size=world_size,
        )
    deepspeed.init_distributed(dist_backend=backend)  # adopts an existing group
