"""The network a supervised command sees: a namespace of its own with one relayed way out.

Owns `Relay` (the loopback addresses bound inside the command's namespace and the one address of
the node they lead to) and `network_namespace_problem` (whether this node can build such a
namespace at all, probed once per process). The namespace is made and the bytes are relayed by
`gyre/sandbox/relay.py`, which the supervisor runs; which address an agent may reach is the
harness's policy (`gyre.agents.isolation`). Knows nothing about HTTP, tasks or agents. Linux only.
"""

from __future__ import annotations

import ipaddress
import subprocess
import sys
from pathlib import Path

import msgspec

from gyre.sandbox import relay

__all__ = ["Relay", "network_namespace_problem"]

_RELAY = str(Path(relay.__file__).resolve())


class Relay(msgspec.Struct, frozen=True, kw_only=True):
    """A sealed network: the command runs in a network namespace of its own where only loopback
    is up and nothing listens but `listen`; a connection to one of them is relayed, by the
    supervisor in the node's namespace, to `target`. Every other address, of this node (its
    loopback ports, its abstract unix sockets) or any other, is out of reach. Needs root with
    CAP_SYS_ADMIN, or unprivileged user namespaces: the command then runs in one of its own that
    maps only its user, to itself (`network_namespace_problem`)."""

    listen: tuple[tuple[str, int], ...]
    """(loopback IP, port) bound inside the command's namespace, e.g. (("127.0.0.1", 8000),)."""
    target: tuple[str, int]
    """(host, port) every connection is relayed to, reached from the node's namespace."""

    def __post_init__(self) -> None:
        if not self.listen:
            raise ValueError(f"listen={self.listen!r} must name at least one address")
        for host, port in self.listen:
            if not ipaddress.ip_address(host).is_loopback or not 0 < port < 65536:
                raise ValueError(
                    f"listen: {(host, port)!r} must be a loopback IP and a port 1-65535"
                )
        if not self.target[0] or not 0 < self.target[1] < 65536:
            raise ValueError(f"target={self.target!r} must be a host and a port 1-65535")


_probe: list[str | None] = []


def network_namespace_problem() -> str | None:
    """None if commands can run with a `Relay` here (root with CAP_SYS_ADMIN, or another user
    where unprivileged user namespaces are allowed), else why not. Probed once per process in a
    throwaway child (`relay.py --probe`)."""
    if not _probe:
        done = subprocess.run(
            [sys.executable, "-I", "-S", _RELAY, "--probe"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        why = done.stderr.strip() or f"status {done.returncode}"
        _probe.append(None if done.returncode == 0 else why)
    return _probe[0]
