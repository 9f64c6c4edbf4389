"""Several hosts on one machine, for tests and benchmarks: network namespaces on a private bridge.

`namespace_hosts(n)` makes n network namespaces ("hosts"), each with loopback and one veth pair
whose other end sits on a bridge in a namespace of its own (the switch), so host i has the
address 10.200.0.<i+1>/24 and reaches the others, and nothing of the machine's own network: no
packet enters or leaves the root namespace. Needs root (`ip netns`); `unavailable()` says why
not. Everything is deleted on exit, also on failure (processes left in a host are killed first).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import msgspec

__all__ = ["Host", "namespace_hosts", "unavailable"]

SUBNET = "10.200.0"


class Host(msgspec.Struct, frozen=True):
    namespace: str
    address: str

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run inside this host's network namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]


def _ip(*args: str, namespace: str | None = None) -> None:
    prefix = ["ip", "netns", "exec", namespace] if namespace else []
    subprocess.run([*prefix, "ip", *args], check=True, capture_output=True, text=True)


def unavailable() -> str | None:
    """Why namespaces cannot be made here (a pytest skip reason), or None."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) to make network namespaces"
    if os.geteuid() != 0:
        return "network namespaces need root (`ip netns add`)"
    probe = f"gyre-probe-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"`ip netns add` failed: {exc.stderr.strip()}"
    _ip("netns", "del", probe)
    return None


def _pids_in(namespace: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def namespace_hosts(n: int) -> Iterator[list[Host]]:
    """n hosts (namespaces with addresses 10.200.0.1 ..) on a private bridge; deleted on exit."""
    if threading.current_thread() is threading.main_thread():  # SIGTERM still cleans up
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    tag = f"g{os.getpid() % 100000}"
    switch = f"{tag}-sw"
    made: list[str] = []
    try:
        _ip("netns", "add", switch)
        made.append(switch)
        _ip("link", "set", "lo", "up", namespace=switch)
        _ip("link", "add", "br0", "type", "bridge", namespace=switch)
        _ip("link", "set", "br0", "up", namespace=switch)
        hosts = []
        for i in range(n):
            ns = f"{tag}-h{i}"
            _ip("netns", "add", ns)
            made.append(ns)
            inside, outside = f"{tag}h{i}", f"{tag}s{i}"
            _ip("link", "add", inside, "type", "veth", "peer", "name", outside)
            _ip("link", "set", inside, "netns", ns)
            _ip("link", "set", outside, "netns", switch)
            _ip("link", "set", outside, "master", "br0", namespace=switch)
            _ip("link", "set", outside, "up", namespace=switch)
            address = f"{SUBNET}.{i + 1}"
            _ip("link", "set", "lo", "up", namespace=ns)
            _ip("addr", "add", f"{address}/24", "dev", inside, namespace=ns)
            _ip("link", "set", inside, "up", namespace=ns)
            hosts.append(Host(ns, address))
        yield hosts
    finally:
        for ns in reversed(made):
            for pid in _pids_in(ns):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for ns in made:
            Path(f"/run/netns/{ns}").unlink(missing_ok=True)
