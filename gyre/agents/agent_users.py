"""Agent uids on a node: holding one per execution, and an execution's files handed to it and back.

Owns `AgentUser` (a uid held with a lock file in `UID_LOCK_DIR` while its execution runs, so no two
running executions on the node share one), `AGENT_OWNED`, `hand_over` / `hand_back`, `chown_tree`
and `held_folder` (an execution's folder while it runs: handed back once, then removed). The
policy of when agents get uids is `gyre.agents.isolation`'s; the harness (`gyre.agents.harness`)
calls these per execution. Knows nothing about namespaces or processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import grp
import os
import pwd
import secrets
import shutil
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import IO

import anyio

from gyre.errors import ExecutionError

__all__ = [
    "AGENT_OWNED",
    "UID_LOCK_DIR",
    "AgentUser",
    "Handover",
    "chown_tree",
    "hand_back",
    "hand_over",
    "held_folder",
]

UID_LOCK_DIR = Path("/run/gyre-agent-uids" if os.path.isdir("/run") else "/tmp/gyre-agent-uids")
"""Root-only folder of one lock file per agent uid in use on this node (all harnesses share it)."""


def chown_tree(top: Path, uid: int, gid: int) -> None:
    """`lchown` `top` and everything under it (symlinks themselves, never their targets)."""
    os.lchown(top, uid, gid)
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, gid)


class AgentUser:
    """One agent uid (gid = uid) held for an execution: an exclusive lock on its lock file."""

    def __init__(self, uid: int, lock: IO[bytes]) -> None:
        self.uid = uid
        self._lock = lock

    def release(self) -> None:
        self._lock.close()

    @classmethod
    def acquire(cls, base: int, count: int) -> AgentUser:
        """A uid in [base, base + count) that no running execution on this node holds and no
        user or group of the node has (random start: a uid is rarely reused right away).
        Raises `ExecutionError` if all are held or the lock folder is not root's own."""
        UID_LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(UID_LOCK_DIR)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or stat.S_IMODE(st.st_mode) & 0o077:
            raise ExecutionError(f"{UID_LOCK_DIR} must be a folder owned by root with mode 0700")
        start = secrets.randbelow(count)
        for i in range(count):
            uid = base + (start + i) % count
            try:
                pwd.getpwuid(uid)
                continue  # a real user of the node
            except KeyError:
                pass
            try:
                grp.getgrgid(uid)
                continue
            except KeyError:
                pass
            lock = open(UID_LOCK_DIR / str(uid), "ab")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                continue
            return cls(uid, lock)
        raise ExecutionError(f"all {count} agent uids from {base} are in use on this node")


AGENT_OWNED = ("workspace", "home", "tmp", "instruction.md")
"""What of an execution folder belongs to its agent uid while the agent runs."""


def hand_over(exec_dir: Path, uid: int) -> None:
    """Give an execution's `AGENT_OWNED` files to the agent's `uid` (gid = uid), owner-only, and
    make `exec_dir` 0711: the agent passes through to its files; it lists nothing."""
    for name in AGENT_OWNED:
        chown_tree(exec_dir / name, uid, uid)
    for name in ("workspace", "home", "tmp"):
        os.chmod(exec_dir / name, 0o700)
    os.chmod(exec_dir / "instruction.md", 0o400)
    os.chmod(exec_dir, 0o711)


def hand_back(exec_dir: Path) -> None:
    """Give the agent's files to root once its tree is gone (its uid may be reused)."""
    for name in AGENT_OWNED:
        if os.path.lexists(exec_dir / name):
            chown_tree(exec_dir / name, 0, 0)


class Handover:
    """An execution's folder whose `AGENT_OWNED` files the agent's uid has until `hand_back`."""

    def __init__(self, exec_dir: Path, *, pending: bool) -> None:
        self.exec_dir = exec_dir
        self.pending = pending
        """The agent's uid still has the files (false without an agent uid)."""

    async def hand_back(self) -> None:
        """`hand_back` the folder (in a thread) the first time; then, or if not pending, nothing."""
        if self.pending:
            self.pending = False
            await anyio.to_thread.run_sync(hand_back, self.exec_dir)


@contextlib.asynccontextmanager
async def held_folder(exec_dir: Path, *, handed_over: bool, keep: bool) -> AsyncIterator[Handover]:
    """An execution's folder while it runs (`handed_over`: its files are the agent uid's). On the
    way out, whatever happens and shielded from cancellation: handed back if it still has to be,
    then removed unless `keep`, even where handing back fails (whose error is raised)."""
    async with contextlib.AsyncExitStack() as cleanup:
        if not keep:
            remove = functools.partial(shutil.rmtree, exec_dir, ignore_errors=True)
            cleanup.push_async_callback(
                _shielded, functools.partial(anyio.to_thread.run_sync, remove)
            )
        handover = Handover(exec_dir, pending=handed_over)
        cleanup.push_async_callback(_shielded, handover.hand_back)
        yield handover


async def _shielded(step: Callable[[], Awaitable[object]]) -> None:
    """Await `step` shielded from cancellation: a cleanup runs to its end."""
    with anyio.CancelScope(shield=True):
        await step()
