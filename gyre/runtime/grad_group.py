"""The run-wide gradient group: point-to-point gradient exchange between training cells.

Owns `host_group_store` (the head node's side: a `torch.distributed.TCPStore` that every cell of
every host meets at, torchrun's rendezvous), `local_address_for` (this host's address on the
route to another) and `GradientGroup` (the cell side: a gloo process group over that store, formed
once at start and kept for the run, separate from each cell's own DeepSpeed group). A satellite
`send`s its flat gradient to the core, the core `recv`s it; both are bounded by a timeout
(docs/design.md invariant 7). Knows nothing about trainers, roles or HTTP; blocking: call from a
worker thread.
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


def _gloo_options(store_host: str, timeout: datetime.timedelta) -> dist.ProcessGroupGloo._Options:
    """Gloo's device: on `$GLOO_SOCKET_IFNAME` when set (torch's own convention), else on this
    host's address on the route to the store. gloo's default (the address the hostname resolves
    to, loopback when it cannot bind it) is unreachable from other hosts or network namespaces."""
    options = dist.ProcessGroupGloo._Options()
    interface = os.environ.get("GLOO_SOCKET_IFNAME")
    if interface:
        options._devices = [dist.ProcessGroupGloo.create_device(interface=interface)]
    else:
        address = local_address_for(store_host)
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=address)]
    options._timeout = timeout
    return options


class GradientGroup:
    """One cell's membership in the run-wide gloo group (`rank` of `world_size`).

    Args:
        address: "HOST:PORT" of the node's store (`host_group_store`).
        rank, world_size: this cell's rank; every rank must join before any returns.
        timeout_s: bound on joining and on each send / receive.

    Raises `ValueError` for a bad rank or address, `TimeoutError`/`RuntimeError` (from gloo)
    when the other ranks do not join within `timeout_s`.
    """

    def __init__(
        self, address: str, rank: int, world_size: int, *, timeout_s: float = 300.0
    ) -> None:
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"group store address {address!r} must be HOST:PORT")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(host, int(port), is_master=False, timeout=timeout)
        self._group = dist.ProcessGroupGloo(
            dist.PrefixStore(_PREFIX, store), rank, world_size, _gloo_options(host, timeout)
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

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        """Send a contiguous CPU tensor to rank `dst`; returns once delivered. Raises `ValueError`
        for a bad peer, `RuntimeError` from gloo when `dst` does not receive within `timeout_s`."""
        self._check_peer(dst)
        work = self._group.send([tensor.contiguous()], dst, GRADIENT_TAG)
        work.wait(datetime.timedelta(seconds=self.timeout_s))
        self.sent += 1

    def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        """Receive into `tensor` (contiguous, the sender's shape and dtype) from rank `src`.
        Raises as `send` does when `src` sends nothing within `timeout_s`."""
        self._check_peer(src)
        work = self._group.recv([tensor], src, GRADIENT_TAG)
        work.wait(datetime.timedelta(seconds=self.timeout_s))
        self.received += 1
        return tensor
