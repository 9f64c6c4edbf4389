"""A supervised command behind a `Relay`: its one way out carries bytes both ways, nothing else
of the node answers, and a target that is down closes the command's connection. Needs root with
CAP_SYS_ADMIN (as here and in CI); skipped elsewhere."""

from __future__ import annotations

import hashlib
import json
import socket
import sys
import threading
from pathlib import Path

import pytest

from gyre.sandbox import Limits, Mounts, Relay, network_namespace_problem, run_supervised

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(network_namespace_problem() is not None,
                       reason=f"needs root with CAP_SYS_ADMIN: {network_namespace_problem()}"),
]

# Sends 3 MiB through the relay, half-closes, reads the echo server's digest; tries the other port.
CLIENT = """
import hashlib, json, os, socket, sys
port, other = int(sys.argv[1]), int(sys.argv[2])
data = os.urandom(3 << 20)
with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    got = b""
    while chunk := s.recv(1 << 16):
        got += chunk
result = {"sent": hashlib.sha256(data).hexdigest(), "echo": got.decode()}
try:
    socket.create_connection(("127.0.0.1", other), timeout=5).close()
    result["other"] = "connected"
except OSError as exc:
    result["other"] = exc.errno
print(json.dumps(result))
"""

# Connects to a relay whose target is down: accepted inside, then closed (or reset).
DOWN = """
import socket, sys
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30) as s:
    s.settimeout(30)
    try:
        print("closed" if s.recv(10) == b"" else "data")
    except ConnectionResetError:
        print("closed")
"""


def _digest_server(listener: socket.socket) -> None:
    """Answers each connection with the SHA-256 of everything it sent (read until its EOF)."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            digest = hashlib.sha256()
            while chunk := conn.recv(1 << 16):
                digest.update(chunk)
            conn.sendall(digest.hexdigest().encode())


async def test_a_relayed_command_reaches_its_target_and_nothing_else(tmp_path: Path) -> None:
    out_path = tmp_path / "out"

    async def run(script: str, relay: Relay, *args: int) -> str:
        with open(out_path, "wb") as out:
            result = await run_supervised(
                [sys.executable, "-I", "-c", script, *map(str, args)], cwd="/", env={},
                limits=Limits(), deadline_s=60, stdout=out, stderr=out, relay=relay)
        assert result.exit_code == 0, out_path.read_text()
        return out_path.read_text()

    with socket.create_server(("127.0.0.1", 0)) as target, \
            socket.create_server(("127.0.0.1", 0)) as other:
        threading.Thread(target=_digest_server, args=(target,), daemon=True).start()
        port, other_port = target.getsockname()[1], other.getsockname()[1]
        relay = Relay(listen=(("127.0.0.1", port),), target=("127.0.0.1", port))
        seen = json.loads(await run(CLIENT, relay, port, other_port))
        assert seen["echo"] == seen["sent"]  # 3 MiB through, byte for byte, EOF passed on
        assert seen["other"] == 111  # ECONNREFUSED: the node's other port is not there
        # the same port inside, relayed to a port of the node where nothing listens
        with socket.create_server(("127.0.0.1", 0)) as gone:
            down = gone.getsockname()[1]
        dead = Relay(listen=(("127.0.0.1", down),), target=("127.0.0.1", down))
        assert (await run(DOWN, dead, down)).split() == ["closed"]


async def test_a_relay_needs_a_network() -> None:
    relay = Relay(listen=(("127.0.0.1", 80),), target=("127.0.0.1", 80))
    with pytest.raises(ValueError, match="relay: the command has no network"):
        await run_supervised(["true"], cwd="/", env={}, limits=Limits(), deadline_s=5,
                             stdout=-3, stderr=-3, mounts=Mounts(network=False), relay=relay)
