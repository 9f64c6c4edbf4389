"""The run-wide group with 2 ranks per cell: shards go rank r to rank r, on the tensors' device.

Four ranks (threads here, processes on GPU) are two cells of two ranks (cell c: ranks 2c and
2c + 1). Cell 1's ranks each send a shard of their own to cell 0 (`send_shard`), whose ranks
receive them into a buffer on their device (`recv_shard`): rank 0 gets rank 2's shard, rank 1
gets rank 3's, nothing crosses. On CPU over gloo here; the same exchange over NCCL with each
rank on its own GPU is marked `gpu`.
"""

from __future__ import annotations

import multiprocessing
import queue
import threading

import pytest
import torch

from gyre.cell.grad_group import GradientGroup, host_group_store

SHARD = 1000


def shard_of(rank: int) -> torch.Tensor:
    """A shard no other rank sends: rank r's values are r * 10000 + 0..SHARD-1."""
    return torch.arange(SHARD, dtype=torch.float32) + 10000.0 * rank


def rank_main(address: str, rank: int, backend: str, results) -> None:
    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    group = GradientGroup(address, rank, 4, timeout_s=60.0, ranks_per_cell=2, backend=backend)
    if group.cell == 1:
        group.send_shard(shard_of(rank).to(device), 0)
        results.put((rank, group.sent, None))
    else:
        buffer = torch.empty(SHARD, device=device)
        got = group.recv_shard(buffer, 1)
        assert got is buffer and got.device == device
        results.put((rank, group.received, got.cpu()))


def exchange(backend: str) -> dict[int, tuple[int, torch.Tensor | None]]:
    """Run the 4 ranks: threads of this process for gloo, processes (one GPU each) for NCCL."""
    store = host_group_store()
    address = f"127.0.0.1:{store.port}"
    if backend == "gloo":
        results = queue.Queue()
        ranks = [
            threading.Thread(target=rank_main, args=(address, r, backend, results))
            for r in range(4)
        ]
    else:
        ctx = multiprocessing.get_context("spawn")
        results = ctx.Queue()
        ranks = [
            ctx.Process(target=rank_main, args=(address, r, backend, results)) for r in range(4)
        ]
    for r in ranks:
        r.start()
    out = {}
    for _ in range(4):
        rank, count, tensor = results.get(timeout=120)
        out[rank] = (count, tensor)
    for r in ranks:
        r.join(60)
    if backend != "gloo":
        assert [r.exitcode for r in ranks] == [0, 0, 0, 0]
    del store
    return out


def check(out) -> None:
    assert out[2] == (1, None) and out[3] == (1, None)  # each satellite rank sent once
    for rank, sender in ((0, 2), (1, 3)):
        count, tensor = out[rank]
        assert count == 1
        assert torch.equal(tensor, shard_of(sender))


def test_shards_go_to_the_matching_rank_over_gloo() -> None:
    check(exchange("gloo"))


def test_bad_layouts_are_refused() -> None:
    with pytest.raises(ValueError, match="world_size=3 must be a multiple of ranks_per_cell=2"):
        GradientGroup("127.0.0.1:1", 0, 3, ranks_per_cell=2)
    with pytest.raises(ValueError, match="backend='mpi' must be 'gloo' or 'nccl'"):
        GradientGroup("127.0.0.1:1", 0, 2, backend="mpi")


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 4,
    reason="needs 4 CUDA devices (one per rank)",
)
def test_shards_go_to_the_matching_rank_over_nccl() -> None:
    check(exchange("nccl"))
