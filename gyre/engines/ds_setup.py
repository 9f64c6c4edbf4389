"""DeepSpeed start-up: the torch.distributed group a trainer runs in.

Owns `init_process_group` (a one-rank group, a launcher's, or a cell's group of k ranks) and
`SHM_OP`, the JIT op it keeps DeepSpeed from building. Knows nothing about models, trainers or
cells.
"""

from __future__ import annotations

import atexit
import os
import socket

import torch

__all__ = ["init_process_group", "SHM_OP"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SHM_OP = "deepspeed_shm_comm"
"""The DeepSpeed op its CPU accelerator would JIT-build at `deepspeed.init_distributed`: C++
compiled for 30-55 s on the 2-core CPU machine (`docs/notes/vllm-cpu.md`). Only
`inference_all_reduce` uses it (DeepSpeed's tensor-parallel inference, `module_inject`); ZeRO's
collectives go through torch.distributed, so gyre never builds it (`init_process_group`). The
switch is DeepSpeed's own table of compatible ops (`deepspeed.ops.__compatible_ops__`, read by
`deepspeed.comm.torch.build_shm_op` in 0.19.8, the version the `cpu` extra pins); it is not public
API, so `tests/engines/test_ds_setup.py` checks that a start still builds nothing."""


def init_process_group(
    *, rank: int = 0, world_size: int = 1, init_method: str | None = None
) -> None:
    """Join (or form) torch.distributed for DeepSpeed: from RANK/WORLD_SIZE/MASTER_* when a
    launcher set them; else rank `rank` of `world_size` at `init_method` ("tcp://HOST:PORT", a
    cell's own group: `gyre.cell.ranks`); else a one-process group on a free loopback
    port. A no-op for the group when one is initialised. On GPU the rank's device is
    `cuda:LOCAL_RANK` (the cell's processes see only the cell's devices). No rendezvous variable
    is written to the environment, so child processes (agents, other nodes) never inherit a stale
    one (only LOCAL_RANK, which DeepSpeed requires: `rank` unless set). On CPU DeepSpeed's
    `SHM_OP` is marked incompatible first, so no start compiles it (GPU accelerators have no such
    op). A gloo group is destroyed at the process's exit (`atexit`, `_destroy_at_exit`). Raises
    `ValueError` for a bad rank or a group of several ranks without `init_method`."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    if world_size > 1 and init_method is None:
        raise ValueError(f"a group of world_size={world_size} ranks needs init_method")
    import deepspeed

    if not torch.cuda.is_available():
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__[SHM_OP] = False  # deepspeed.comm.torch.build_shm_op
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
    if backend == "gloo":
        atexit.unregister(_destroy_at_exit)  # registered once however often this is called
        atexit.register(_destroy_at_exit)


def _destroy_at_exit() -> None:
    """Destroy the gloo process group while the interpreter is still whole (`atexit`): its
    backend is shut down and its store released there, not in C++ teardown: a process that exited
    with the group alive could abort with SIGABRT after a clean run (PyTorch's docs ask for
    `destroy_process_group` before exit; measured in `docs/notes/vllm-cpu.md`). Not for NCCL: its
    shutdown may wait on work in flight or on peers (`destroy_process_group`'s own comment), which
    an exit must not."""
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
