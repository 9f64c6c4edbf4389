"""A supervised command behind a `Relay`: its one way out carries bytes both ways, nothing else
of the node answers, and a target that is down closes the command's connection; without root, in
a user namespace of its own, the same. Needs root with CAP_SYS_ADMIN or unprivileged user
namespaces (both here and in CI); skipped elsewhere."""

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
    pytest.mark.skipif(
        network_namespace_problem() is not None,
        reason=f"no network namespace: {network_namespace_problem()}",
    ),
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
                [sys.executable, "-I", "-c", script, *map(str, args)],
                cwd="/",
                env={},
                limits=Limits(),
                deadline_s=60,
                stdout=out,
                stderr=out,
                relay=relay,
            )
        assert result.exit_code == 0, out_path.read_text()
        return out_path.read_text()

    with (
        socket.create_server(("127.0.0.1", 0)) as target,
        socket.create_server(("127.0.0.1", 0)) as other,
    ):
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


# 32 connections at once through the relay, each 256 KiB out and its digest back.
MANY = """
import concurrent.futures, hashlib, os, socket, sys
def one(i):
    data = os.urandom(256 << 10)
    with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=60) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := s.recv(1 << 16):
            got += chunk
    return got.decode() == hashlib.sha256(data).hexdigest()
with concurrent.futures.ThreadPoolExecutor(32) as pool:
    print(sum(pool.map(one, range(32))))
"""


async def test_concurrent_connections_through_one_relay(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0), backlog=64) as target:
        for _ in range(4):
            threading.Thread(target=_digest_server, args=(target,), daemon=True).start()
        port = target.getsockname()[1]
        relay = Relay(listen=(("127.0.0.1", port),), target=("127.0.0.1", port))
        with open(tmp_path / "out", "wb") as out:
            result = await run_supervised(
                [sys.executable, "-I", "-c", MANY, str(port)],
                cwd="/",
                env={},
                limits=Limits(),
                deadline_s=120,
                stdout=out,
                stderr=out,
                relay=relay,
            )
    assert result.exit_code == 0, (tmp_path / "out").read_text()
    assert (tmp_path / "out").read_text().split() == ["32"]


async def test_a_relay_needs_a_network() -> None:
    relay = Relay(listen=(("127.0.0.1", 80),), target=("127.0.0.1", 80))
    with pytest.raises(ValueError, match="relay: the command has no network"):
        await run_supervised(
            ["true"],
            cwd="/",
            env={},
            limits=Limits(),
            deadline_s=5,
            stdout=-3,
            stderr=-3,
            mounts=Mounts(network=False),
            relay=relay,
        )


# Run as an unprivileged user: serves a target, runs CLIENT behind a Relay to it, prints
# CLIENT's result with the command's uid and effective capabilities.
AS_NOBODY = """
import anyio, json, socket, sys, threading
from gyre.sandbox import Limits, Relay, network_namespace_problem, run_supervised
from tests.sandbox.test_relay import CLIENT, _digest_server
other = int(sys.argv[1])
assert network_namespace_problem() is None, network_namespace_problem()
status = "open('/proc/self/status').read().split('CapEff:')[1].split()[0]"
probe = CLIENT + f"print({status}, os.getuid())"
async def main():
    with socket.create_server(("127.0.0.1", 0)) as target:
        threading.Thread(target=_digest_server, args=(target,), daemon=True).start()
        port = target.getsockname()[1]
        relay = Relay(listen=(("127.0.0.1", port),), target=("127.0.0.1", port))
        with open(sys.argv[2], "wb") as out:
            result = await run_supervised(
                [sys.executable, "-I", "-c", probe, str(port), str(other)], cwd="/", env={},
                limits=Limits(), deadline_s=60, stdout=out, stderr=out, relay=relay)
    print(result.exit_code)
anyio.run(main)
"""


async def test_without_root_a_user_namespace_seals_the_same_way() -> None:
    """The node as an unprivileged user (uid 65534 here): the command's network namespace is
    owned by a user namespace of its own; it keeps its uid, holds no capability after exec, and
    reaches its target alone (not a port the root test process listens on)."""
    import os
    import shutil
    import stat
    import subprocess
    import tempfile

    python = "/usr/bin/python3"  # the venv's may lie under a folder only root may enter
    version = subprocess.run(
        [python, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
    ).stdout.strip()
    if os.geteuid() != 0 or version != str(sys.version_info[:2]):
        pytest.skip(f"needs root to become another user and {python} at {sys.version_info[:2]}")
    site = next(p for p in sys.path if p.endswith("site-packages"))
    repo = str(Path(__file__).resolve().parents[2])
    for needed in (site, repo):  # e.g. a checkout cloned into a 0700 mktemp folder
        closed = next(
            (f for f in Path(needed).parents if not os.stat(f).st_mode & stat.S_IXOTH), None
        )
        if closed is not None:
            pytest.skip(f"uid 65534 cannot reach {needed}: {closed} is closed to other users")
    folder = Path(tempfile.mkdtemp(prefix="gyre-relay-", dir="/tmp"))  # its user writes here
    try:
        os.chmod(folder, 0o777)
        out = folder / "out"
        with socket.create_server(("127.0.0.1", 0)) as other:
            done = subprocess.run(
                [
                    "setpriv",
                    "--reuid=65534",
                    "--regid=65534",
                    "--clear-groups",
                    python,
                    "-c",
                    AS_NOBODY,
                    str(other.getsockname()[1]),
                    str(out),
                ],
                cwd="/",
                env={"PYTHONPATH": f"{repo}:{site}", "PATH": "/usr/bin:/bin"},
                capture_output=True,
                text=True,
                timeout=120,
            )
        if "CLONE_NEWUSER" in done.stderr:
            pytest.skip(f"no unprivileged user namespaces here: {done.stderr[-300:]}")
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["0"], out.read_text()
        lines = out.read_text().splitlines()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    seen = json.loads(lines[0])
    assert seen["echo"] == seen["sent"] and seen["other"] == 111
    assert lines[1].split() == ["0000000000000000", "65534"]
