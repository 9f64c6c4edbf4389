"""The config of a run over several hosts: `ClusterConfig` (the `[cluster]` section).

Owns where the head node listens for workers, how many it waits for, and the shared secret a join
must carry. Knows nothing about the join protocol itself (`gyre.cell.join`) or the file format.
"""

from __future__ import annotations

import os

from gyre.config.base import Config, check_positive

__all__ = ["ClusterConfig", "JOIN_SECRET_ENV"]

JOIN_SECRET_ENV = "GYRE_JOIN_SECRET"
"""Environment variable holding the join secret (the worker's only source; the head's when
`[cluster] secret` is empty)."""


class ClusterConfig(Config, frozen=True):
    """The head node of a run over several hosts (`python -m gyre.node --config F` on the head,
    `python -m gyre.node --join HEAD:PORT` on each worker). With `workers = 0` (the default) the
    run stays on this host and nothing listens."""

    workers: int = 0
    """Worker hosts the head waits for before the run starts; each starts `cells.num_cells` cells,
    so the run has `cells.num_cells * (workers + 1)` cells (rank 0, the core, is on the head)."""
    host: str = "127.0.0.1"
    """The head's address as the workers reach it: the join endpoint binds to it, and the
    gradient group's TCPStore is announced at it."""
    port: int = 29400
    """TCP port of the head's join endpoint (HTTP)."""
    store_port: int = 0
    """TCP port of the gradient group's TCPStore (torch.distributed's rendezvous); 0 picks a free
    one (announced to workers when they join)."""
    secret: str = ""
    """Shared secret a worker's join must carry; empty: `$GYRE_JOIN_SECRET`. A run with workers
    and neither is a config error."""
    join_timeout_s: float = 600.0
    """Longest wait for every worker to join and offer its ready cells."""
    heartbeat_s: float = 1.0
    """Seconds between the head's heartbeats on each worker's connection (a worker that hears
    nothing for 10 of them, or sees the connection end, stops its cells)."""

    def __post_init__(self) -> None:
        if self.workers < 0:
            raise ValueError(f"workers={self.workers} must be >= 0")
        if not self.host:
            raise ValueError(f"host={self.host!r} must not be empty")
        for name, port in (("port", self.port), ("store_port", self.store_port)):
            if not 0 <= port < 65536:
                raise ValueError(f"{name}={port} must be in [0, 65535]")
        check_positive(join_timeout_s=self.join_timeout_s, heartbeat_s=self.heartbeat_s)

    def join_secret(self) -> str:
        """The secret joins must carry: `secret`, else `$GYRE_JOIN_SECRET`, else ""."""
        return self.secret or os.environ.get(JOIN_SECRET_ENV, "")
