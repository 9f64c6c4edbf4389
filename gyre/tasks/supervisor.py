"""The supervisor: a tiny process between the harness and an agent command that owns its tree.

Run as a script (`python -I -S supervisor.py '<settings json>' -- cmd ...`; standard library
only, so it starts fast and imports nothing of gyre). It marks itself a child subreaper
(`prctl(PR_SET_CHILD_SUBREAPER)`), so every process the agent starts stays its descendant even
after `setsid` and double forks; forks the command with resource limits (`RLIMIT_CPU`,
`RLIMIT_AS`, `RLIMIT_NPROC`, `RLIMIT_FSIZE`) and, when the settings name a `uid` and `gid`, drops
to that user right before exec (no supplementary groups, `PR_SET_NO_NEW_PRIVS`; the supervisor
keeps its own user, so it can still signal the tree); on SIGTERM forwards SIGTERM to the whole
tree; when the command exits, SIGKILLs what it left behind and exits with the command's status
(128 + N when signal N killed it). If the harness process dies, it kills the tree and exits. Also
owns the /proc scan (`descendants`) that the harness uses to kill a tree. Knows nothing about
tasks or models. Linux only.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
import threading
import time

__all__ = ["descendants", "live_descendants", "kill_descendants", "main"]

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38


def _process_table() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, state) of every process visible in /proc."""
    table: dict[int, tuple[int, str]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # exited while we scanned
            continue
        # comm may contain spaces and parentheses: the fields follow the last ')'
        fields = stat[stat.rfind(b")") + 2 :].split()
        table[int(name)] = (int(fields[1]), fields[0].decode())
    return table


def descendants(root: int) -> list[int]:
    """PIDs of all descendants of `root` (not `root` itself), zombies included, parents first."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _state) in _process_table().items():
        children.setdefault(ppid, []).append(pid)
    out: list[int] = []
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(children.get(pid, ()))
    return out


def live_descendants(root: int) -> list[int]:
    """Like `descendants` but without zombies (exited, waiting to be reaped)."""
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _state) in table.items():
        children.setdefault(ppid, []).append(pid)
    out: list[int] = []
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        if table[pid][1] != "Z":
            out.append(pid)
        stack.extend(children.get(pid, ()))
    return out


def kill_descendants(root: int, sig: int) -> int:
    """Send `sig` to every live descendant of `root`; returns how many were signalled."""
    n = 0
    for pid in live_descendants(root):
        try:
            os.kill(pid, sig)
            n += 1
        except ProcessLookupError:
            pass
    return n


def _user_tasks(uid: int) -> int:
    """Tasks (threads) running under real uid `uid`: what RLIMIT_NPROC counts."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                status = f.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            total += int(fields.get("Threads", "1"))
    return total


def _apply_limits(limits: dict) -> None:
    """Set resource limits in the forked child, before exec. 0 or missing means no limit.

    RLIMIT_NPROC is counted for the uid the command will run as (`limits["uid"]`, else ours)."""
    if limits.get("cpu_time_s"):
        cpu = int(limits["cpu_time_s"])
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    if limits.get("memory_bytes"):
        resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"],) * 2)
    if limits.get("file_size_bytes"):
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_size_bytes"],) * 2)
    if limits.get("max_processes"):
        # RLIMIT_NPROC counts every task of the uid, so the limit is relative to what runs now.
        uid = limits.get("uid")
        n = _user_tasks(os.getuid() if uid is None else int(uid)) + int(limits["max_processes"])
        resource.setrlimit(resource.RLIMIT_NPROC, (n, n))


def _drop_user(uid: int, gid: int) -> None:
    """Become `uid`:`gid` with no supplementary groups, for good (real, effective and saved IDs).

    `PR_SET_NO_NEW_PRIVS` first: no setuid binary can raise the command's privileges again."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getgid() != gid or os.getgroups():
        raise OSError(f"still uid={os.getuid()}/{os.geteuid()} gid={os.getgid()} groups={os.getgroups()}")


def main(argv: list[str]) -> int:
    """Settings JSON: the `Limits` fields, and optionally `uid` and `gid` to run the command as."""
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: supervisor.py '<settings json>' -- command [args...]\n")
        return 2
    limits = json.loads(argv[0])
    command = argv[2:]
    me = os.getpid()
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    # PR_SET_PDEATHSIG fires when the *thread* that forked us exits, and event loops spawn from
    # worker threads that come and go (trio's open_process): so the death signal is SIGUSR1 and
    # only counts when the harness process itself is gone; a watchdog thread covers later deaths.
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGUSR1, 0, 0, 0)

    def orphaned() -> None:
        while kill_descendants(me, signal.SIGKILL):
            pass
        os._exit(128 + signal.SIGTERM)

    def on_parent_death(signum, frame):
        if os.getppid() != parent:  # the harness is gone: nobody will clean up but us
            orphaned()

    def on_term(signum, frame):
        if os.getppid() != parent:
            orphaned()
        kill_descendants(me, signal.SIGTERM)

    def watchdog() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                orphaned()

    signal.signal(signal.SIGUSR1, on_parent_death)
    signal.signal(signal.SIGTERM, on_term)
    threading.Thread(target=watchdog, daemon=True).start()
    child = os.fork()
    if child == 0:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            _apply_limits(limits)
            if limits.get("uid") is not None:
                _drop_user(int(limits["uid"]), int(limits["gid"]))
            os.execvp(command[0], command)
        except BaseException as exc:  # noqa: BLE001 - report any exec failure and exit
            os.write(2, f"gyre supervisor: cannot run {command[0]!r}: {exc}\n".encode())
        os._exit(127)
    status = None
    while True:
        try:
            pid, wstatus = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid == child:
            status = wstatus
        if status is not None:
            kill_descendants(me, signal.SIGKILL)  # the agent is done: nothing may outlive it
    code = os.waitstatus_to_exitcode(status) if status is not None else 127
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
