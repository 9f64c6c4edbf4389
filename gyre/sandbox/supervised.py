"""Run one command as a supervised process tree with resource limits and an outside deadline.

Owns `Limits`, `ProcessResult`, `run_supervised` and `tail`: the command runs under
`gyre/sandbox/supervisor.py` (child subreaper + rlimits, optionally as another user, optionally in
the private mount namespace a `gyre.sandbox.mounts.Mounts` describes) in a new session; the call
waits for it to exit, for the deadline, or for a stop event, and then makes sure nothing of the
tree is left: SIGTERM to the group and every descendant, `kill_grace_s` to exit, then SIGKILL until
the tree is empty. Used by the harness (agents) and the scorer (verifiers). Runs on any anyio
backend; /proc scans run in worker threads. Knows nothing about tasks, agents, models or scores.
Linux only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Literal

import anyio
import anyio.abc
import msgspec

from gyre.sandbox import supervisor
from gyre.sandbox.mounts import Mounts
from gyre.sandbox.network import Relay

__all__ = ["Limits", "ProcessResult", "run_supervised", "tail"]

_SUPERVISOR = str(Path(supervisor.__file__).resolve())


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """Resource limits of a supervised command; 0 disables one."""

    cpu_time_s: float = 0
    """RLIMIT_CPU, CPU seconds of each process (SIGXCPU past it)."""
    memory_bytes: int = 0
    """RLIMIT_AS, address space of each process, bytes."""
    max_processes: int = 0
    """Extra tasks (processes + threads) the command may create beyond those the uid runs now."""
    file_size_bytes: int = 0
    """RLIMIT_FSIZE, largest file a process may write, bytes."""

    def __post_init__(self) -> None:
        for name in ("cpu_time_s", "memory_bytes", "max_processes", "file_size_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 0 (0: no limit)")


class ProcessResult(msgspec.Struct, frozen=True, kw_only=True):
    """How a supervised command ended."""

    ended: Literal["exited", "deadline", "stopped"]
    """`exited` on its own, killed at the `deadline`, or killed because `stop` was set."""
    exit_code: int
    """The command's status (128 + N: signal N) or the supervisor's (negative: killed by us)."""
    wall_s: float
    """Seconds from start until the tree was gone."""
    started_s: float
    """Unix time of the start, seconds."""
    pid: int
    """PID of the supervisor (the session and group leader)."""


def _tree_alive(root: int) -> bool:
    return bool(supervisor.live_descendants(root))


def _kill_hard(root: int) -> None:
    """SIGKILL every descendant until none is left (forks racing the scan are caught next round)."""
    for _ in range(100):
        if not supervisor.kill_descendants(root, signal.SIGKILL):
            break
    try:
        os.killpg(root, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


async def _end_tree(proc: anyio.abc.Process, grace_s: float) -> None:
    """SIGTERM the tree, wait up to `grace_s` for it to exit, SIGKILL the rest and the
    supervisor."""
    root = proc.pid
    if proc.returncode is None:
        # The supervisor forwards SIGTERM to descendants that left the group (setsid).
        await anyio.to_thread.run_sync(_signal_group, root, signal.SIGTERM)
        with anyio.move_on_after(grace_s):
            while proc.returncode is None and await anyio.to_thread.run_sync(_tree_alive, root):
                await anyio.sleep(0.05)
    if proc.returncode is None:
        await anyio.to_thread.run_sync(_kill_hard, root)
    with anyio.move_on_after(10):
        await proc.wait()
    assert proc.returncode is not None, f"supervisor {root} survived SIGKILL"


async def run_supervised(
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str],
    env: Mapping[str, str],
    limits: Limits,
    deadline_s: float,
    stdout: IO[bytes] | int,
    stderr: IO[bytes] | int,
    kill_grace_s: float = 1.0,
    stop: anyio.Event | None = None,
    user: tuple[int, int] | None = None,
    mounts: Mounts | None = None,
    relay: Relay | None = None,
    pass_fds: Sequence[int] = (),
) -> ProcessResult:
    """Run `argv` supervised until it exits, `deadline_s` passes or `stop` is set; kill its tree.

    `user` = (uid, gid): the command runs as that user with no supplementary groups (needs root;
    the supervisor keeps our user, so the tree can still be signalled and killed); None: as we
    run. `mounts`: the command (and everything it starts) sees the filesystem `Mounts` describes
    (check `mount_namespace_problem` first). `relay`: the command runs in a network namespace of
    its own that reaches only `relay.target` (check `network_namespace_problem`). On return (and
    on cancellation) no process of the tree is alive. Raises `OSError` if the supervisor cannot be
    started, `ValueError` for a negative uid or gid or a `relay` with `mounts.network` false; a
    command that cannot be executed, or whose user, mounts or network cannot be set, exits with
    status 127 and says why on its stderr. `pass_fds`: descriptors handed over to the command
    (inherited at the same numbers); closed here once it started, or failed to, so a pipe's
    reader sees its end when the command's tree is gone.
    """
    if deadline_s <= 0:
        raise ValueError(f"deadline_s={deadline_s!r} must be > 0")
    settings = msgspec.to_builtins(limits)
    if user is not None:
        uid, gid = user
        if uid < 0 or gid < 0:
            raise ValueError(f"user={user!r}: uid and gid must be >= 0")
        settings.update(uid=uid, gid=gid)
    if mounts is not None:
        settings["mounts"] = msgspec.to_builtins(mounts)
    if relay is not None:
        if mounts is not None and not mounts.network:
            raise ValueError("relay: the command has no network (mounts.network is false)")
        settings["relay"] = msgspec.to_builtins(relay)
    cmd = [sys.executable, "-I", "-S", _SUPERVISOR, json.dumps(settings), "--", *argv]
    started_s = time.time()
    t0 = time.monotonic()
    try:
        proc = await anyio.open_process(
            cmd,
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            pass_fds=tuple(pass_fds),
        )
    finally:
        for fd in pass_fds:
            os.close(fd)
    ended: Literal["exited", "deadline", "stopped"] = "deadline"
    try:
        async with anyio.create_task_group() as tg:

            async def wait_stop() -> None:
                assert stop is not None
                await stop.wait()
                nonlocal ended
                if proc.returncode is None:
                    ended = "stopped"
                tg.cancel_scope.cancel()

            if stop is not None:
                tg.start_soon(wait_stop)
            with anyio.move_on_after(deadline_s):
                await proc.wait()
                ended = "exited"
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await _end_tree(proc, kill_grace_s)
    assert proc.returncode is not None
    return ProcessResult(
        ended=ended,
        exit_code=proc.returncode,
        wall_s=time.monotonic() - t0,
        started_s=started_s,
        pid=proc.pid,
    )


def tail(path: str | os.PathLike[str] | IO[bytes], max_bytes: int = 4096) -> str:
    """The last `max_bytes` of a file, decoded as UTF-8 with replacement; '' if it is missing.

    `path` may be an open binary file that can be read and seeked (read by descriptor, so a
    file renamed or replaced meanwhile does not matter)."""
    if not isinstance(path, (str, os.PathLike)):
        path.seek(0, os.SEEK_END)
        path.seek(max(0, path.tell() - max_bytes))
        return path.read().decode("utf-8", errors="replace")
    try:
        with open(path, "rb") as f:
            return tail(f, max_bytes)
    except FileNotFoundError:
        return ""
