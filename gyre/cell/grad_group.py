"""The run-wide gradient group: gradient exchange between training cells, shard by shard.

Owns `host_group_store` (the head node's side: a `torch.distributed.TCPStore` that every cell of
every host meets at, torchrun's rendezvous), `local_address_for` (this host's address on the
route to another) and `GradientGroup` (one rank's side: a process group over that store, gloo on
CPU, NCCL on GPU, formed once at start and kept for the run, separate from each cell's own
DeepSpeed group). Every rank of every cell is a member: a cell of k devices is ranks
cell * k .. cell * k + k - 1. A satellite's rank r sends its gradient shard to rank r of the core
(`send_shard`), which adds it to its own (`recv_shard`): the reduce of the two cells' shards,
rank by rank, never a whole vector to one rank. Tensors may live on any device: gloo's wire is
CPU, NCCL's the device. Each send / receive is bounded by a timeout (docs/design.md invariant 7).
Knows nothing about trainers, roles or HTTP; blocking: call from a worker thread.
"""

from __future__ import annotations

import datetime
import os
import socket

import torch
import torch.distributed as dist

__all__ = ["GradientGroup", "host_group_store", "local_address_for", "GRADIENT_TAG"]

GRADIENT_TAG = 7
"""gloo tag of a flat-gradient message."""
_PREFIX = "gyre-grad"


def host_group_store(
    host: str = "127.0.0.1", timeout_s: float = 300.0, *, port: int = 0
) -> dist.TCPStore:
    """Start the run's rendezvous store on the node at `port` (0: a free one; read it from `.port`).
    The store listens on every interface of the host; cells on other hosts reach it at an address
    of this one (`[cluster] host`).

    Keep the returned object alive for the whole run: the store lives in this process."""
    return dist.TCPStore(
        host,
        port,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def local_address_for(host: str) -> str:
    """This host's IPv4 address on the route to `host` (the kernel's choice of source address; no
    packet is sent): the address other hosts reach this one at. Raises `OSError` when `host` does
    not resolve or no route leads to it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))  # UDP connect only picks the route
        return probe.getsockname()[0]


def _gloo_options(
    store_host: str,
    timeout: datetime.timedelta,
) -> dist.ProcessGroupGloo._Options:  # type: ignore[name-defined]  # torch's stubs omit _Options
    """Gloo's device: on `$GLOO_SOCKET_IFNAME` when set (torch's own convention), else on this
    host's address on the route to the store. gloo's default (the address the hostname resolves
    to, loopback when it cannot bind it) is unreachable from other hosts or network namespaces."""
    options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # as above
    interface = os.environ.get("GLOO_SOCKET_IFNAME")
    if interface:
        options._devices = [dist.ProcessGroupGloo.create_device(interface=interface)]
    else:
        address = local_address_for(store_host)
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=address)]
    options._timeout = timeout
    return options


class GradientGroup:
    """One rank's membership in the run-wide group (`rank` of `world_size`).

    Args:
        address: "HOST:PORT" of the node's store (`host_group_store`).
        rank, world_size: this rank; every rank must join before any returns.
        timeout_s: bound on joining and on each send / receive.
        ranks_per_cell: k, the ranks of each cell (`cells.devices_per_cell`); `world_size` is a
            multiple of it.
        backend: "gloo" or "nccl"; default NCCL where CUDA is available (the tensors exchanged
            then stay on this rank's device, `torch.cuda.current_device()`), else gloo.

    Raises `ValueError` for a bad rank, address or backend, `TimeoutError`/`RuntimeError` (from
    the backend) when the other ranks do not join within `timeout_s`.
    """

    def __init__(
        self,
        address: str,
        rank: int,
        world_size: int,
        *,
        timeout_s: float = 300.0,
        ranks_per_cell: int = 1,
        backend: str | None = None,
    ) -> None:
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"group store address {address!r} must be HOST:PORT")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
        if ranks_per_cell < 1 or world_size % ranks_per_cell:
            raise ValueError(
                f"world_size={world_size} must be a multiple of ranks_per_cell={ranks_per_cell}"
            )
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend={backend!r} must be 'gloo' or 'nccl'")
        self.rank = rank
        self.world_size = world_size
        self.ranks_per_cell = ranks_per_cell
        self.cell, self.local_rank = divmod(rank, ranks_per_cell)
        """This rank's cell (its index in the run) and its rank within the cell."""
        self.backend = backend
        self.timeout_s = timeout_s
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.PrefixStore(
            _PREFIX, dist.TCPStore(host, int(port), is_master=False, timeout=timeout)
        )
        self._group: dist.ProcessGroupNCCL | dist.ProcessGroupGloo
        if backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self._group = dist.ProcessGroupNCCL(store, rank, world_size, options)
        else:
            self._group = dist.ProcessGroupGloo(
                store, rank, world_size, _gloo_options(host, timeout)
            )
        self.sent = 0
        """Gradient vectors sent so far."""
        self.received = 0
        """Gradient vectors received so far."""

    def _check_peer(self, peer: int) -> None:
        if not 0 <= peer < self.world_size or peer == self.rank:
            raise ValueError(
                f"peer rank {peer} must be another rank in [0, {self.world_size}) "
                f"(this is {self.rank})"
            )

    def _wire(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` as the backend moves it: contiguous, on CPU for gloo (a copy when it is on a
        device), where it is for NCCL."""
        wire = tensor.contiguous()
        return wire if self.backend == "nccl" else wire.cpu()

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        """Send `tensor` (any device) to rank `dst`; returns once delivered. Raises `ValueError`
        for a bad peer, `RuntimeError` from the backend when `dst` does not receive within
        `timeout_s`."""
        self._check_peer(dst)
        # torch's stubs omit Backend.send / recv, which both bindings have
        work = self._group.send([self._wire(tensor)], dst, GRADIENT_TAG)  # type: ignore[union-attr]
        work.wait(datetime.timedelta(seconds=self.timeout_s))
        self.sent += 1

    def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        """Receive into `tensor` (the sender's shape and dtype, any device) from rank `src`.
        Raises as `send` does when `src` sends nothing within `timeout_s`."""
        self._check_peer(src)
        wire = self._wire(tensor)
        work = self._group.recv([wire], src, GRADIENT_TAG)  # type: ignore[union-attr]  # as send
        work.wait(datetime.timedelta(seconds=self.timeout_s))
        if wire is not tensor:
            tensor.copy_(wire)
        self.received += 1
        return tensor

    def rank_in(self, cell: int) -> int:
        """The rank of cell `cell` that matches this one (the same rank within its cell)."""
        if not 0 <= cell < self.world_size // self.ranks_per_cell:
            raise ValueError(
                f"cell {cell} must be in [0, {self.world_size // self.ranks_per_cell})"
            )
        return cell * self.ranks_per_cell + self.local_rank

    def send_shard(self, shard: torch.Tensor, cell: int) -> None:
        """Send this rank's gradient shard to the matching rank of cell `cell` (the core);
        raises as `send`."""
        self.send(shard, self.rank_in(cell))

    def recv_shard(self, shard: torch.Tensor, cell: int) -> torch.Tensor:
        """Receive the matching rank of cell `cell`'s shard into `shard`; raises as `recv`."""
        return self.recv(shard, self.rank_in(cell))
