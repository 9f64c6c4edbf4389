"""The supervisor: a tiny process between the harness and an agent command that owns its tree.

Run as a script (`python -I -S supervisor.py '<settings json>' -- cmd ...`; standard library
only, so it starts fast and imports nothing of gyre). It marks itself a child subreaper
(`prctl(PR_SET_CHILD_SUBREAPER)`), so every process the agent starts stays its descendant even
after `setsid` and double forks; forks the command with resource limits (`RLIMIT_CPU`,
`RLIMIT_AS`, `RLIMIT_NPROC`, `RLIMIT_FSIZE`) and, when the settings name a `uid` and `gid`, drops
to that user right before exec (no supplementary groups, `PR_SET_NO_NEW_PRIVS`; the supervisor
keeps its own user, so it can still signal the tree). With `mounts` in the settings the child
first enters a private mount namespace (`enter_mount_namespace`) where folders are hidden under
empty tmpfs, a few are bound back at their real paths, and the tree may be made read-only. On
SIGTERM forwards SIGTERM to the whole tree; when the command exits, SIGKILLs what it left behind and
exits with the command's status (128 + N when signal N killed it). If the harness process dies, it
kills the tree and exits. Also owns the /proc scan (`descendants`) that the harness uses to kill a
tree. Knows nothing about tasks or models. Linux only.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import socket
import sys
import threading
import time

__all__ = ["descendants", "live_descendants", "kill_descendants", "enter_mount_namespace", "main"]

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38

# <sched.h>, <sys/mount.h>, <linux/mount.h>; mount_setattr is 442 on every architecture (the
# syscall numbers added since Linux 5.1 are shared), and needs Linux >= 5.12.
_CLONE_NEWNS, _CLONE_NEWNET = 0x00020000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = (
    1,
    2,
    4,
    32,
    4096,
    16384,
    1 << 18,
)
_SYS_MOUNT_SETATTR = 442
_AT_FDCWD, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = -100, 0x8000, 1
_PRIVATE_TMP_BYTES = 1 << 30
"""Size limit of each fresh writable tmpfs (`private` folders), bytes."""


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
        raise OSError(
            f"still uid={os.getuid()}/{os.geteuid()} gid={os.getgid()} groups={os.getgroups()}"
        )


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_ulong,
        ctypes.c_char_p,
    ]
    return libc


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(
    libc: ctypes.CDLL,
    source: str | None,
    target: str,
    fstype: str | None,
    flags: int,
    data: str | None = None,
) -> None:
    enc = lambda v: None if v is None else os.fsencode(v)  # noqa: E731
    _check(
        libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)),
        f"mount({source!r}, {target!r}, {fstype!r}, {flags:#x}, {data!r})",
    )


def _depth(path: str) -> int:
    return len([part for part in path.split("/") if part])


def enter_mount_namespace(mounts: dict) -> None:
    """Move the calling process into a private mount namespace laid out by `mounts` (root only).

    `mounts` (all paths absolute; a missing one is skipped):
    - `read_only`: every mount becomes read-only first (`mount_setattr(AT_RECURSIVE)`);
    - `hide`: folders covered by an empty tmpfs (0755), files by /dev/null; read-only at the end;
    - `private`: folders covered by a fresh writable tmpfs (1777, `_PRIVATE_TMP_BYTES`), e.g. /tmp;
    - `traverse`: folders other users cannot enter (0700) that they pass through here as if they
      had o+x: covered by a 0711 tmpfs on which every entry is bound back at its own path (a
      symlink is recreated; sockets, FIFOs and devices are left out), so what lies below keeps its
      own modes and nobody lists the folder;
    - `expose` (read-only) and `writable`: folders (or single files) bound back at their own path
      (their content as seen before anything was hidden; missing parents are created 0755 on the
      covering tmpfs).
    Operations run shallowest path first (at one path: cover, then bind), so a folder exposed under
    a hidden one, or hidden under an exposed one, ends as asked. Changes to this namespace never
    reach the node's. The working folder is looked up again by path at the end. Raises `OSError`
    (errno set) when a step fails; the caller must not run the command then. Linux only; needs
    CAP_SYS_ADMIN.
    """
    libc = _libc()
    cwd = os.getcwd()
    _check(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing propagates back to the node
    binds: dict[str, tuple[int, bool]] = {}
    entries: dict[str, list[tuple[str, int | str]]] = {}  # traversed folder -> (name, fd or link)
    try:
        for key, writable in (("expose", False), ("writable", True)):
            for path in mounts.get(key, ()):
                if os.path.isdir(path) or os.path.isfile(path):  # opened before anything is covered
                    binds[path] = (os.open(path, os.O_PATH | os.O_CLOEXEC), writable)
        for path in mounts.get("traverse", ()):
            if os.path.isdir(path):
                entries[path] = []
                with os.scandir(path) as scan:
                    for entry in scan:
                        if entry.is_symlink():
                            entries[path].append((entry.name, os.readlink(entry.path)))
                        elif entry.is_dir() or entry.is_file():
                            fd = os.open(entry.path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
                            entries[path].append((entry.name, fd))
        if mounts.get("read_only"):
            attr = _MountAttr(_MOUNT_ATTR_RDONLY, 0, 0, 0)
            _check(
                libc.syscall(
                    _SYS_MOUNT_SETATTR,
                    _AT_FDCWD,
                    b"/",
                    _AT_RECURSIVE,
                    ctypes.byref(attr),
                    ctypes.sizeof(attr),
                ),
                "mount_setattr(/, AT_RECURSIVE, MOUNT_ATTR_RDONLY)",
            )
        ops = [(p, 0, "hide") for p in mounts.get("hide", ())]
        ops += [(p, 0, "traverse") for p in entries]
        ops += [(p, 0, "private") for p in mounts.get("private", ())]
        ops += [(p, 1, "bind") for p in binds]
        covers: list[str] = []
        hidden: list[str] = []
        for path, _order, kind in sorted(ops, key=lambda op: (_depth(op[0]), op[1])):
            if kind == "bind":
                fd, writable = binds[path]
                if not any(
                    path == c or path.startswith(c.rstrip("/") + "/") for c in covers
                ) and not (writable and mounts.get("read_only")):
                    continue  # already visible as it is
                if os.path.isdir(f"/proc/self/fd/{fd}"):
                    os.makedirs(path, mode=0o755, exist_ok=True)
                elif not os.path.exists(path):  # a file: bound onto an empty one
                    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
                    os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
                _mount(libc, f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC)
                ro = 0 if writable else _MS_RDONLY
                _mount(libc, None, path, None, _MS_REMOUNT | _MS_BIND | _MS_NOSUID | _MS_NODEV | ro)
            elif kind == "traverse" and os.path.isdir(path):
                _mount(libc, "tmpfs", path, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0711,size=1m")
                for name, source in entries[path]:
                    target = os.path.join(path, name)
                    if isinstance(source, str):
                        os.symlink(source, target)
                        continue
                    if os.path.isdir(f"/proc/self/fd/{source}"):
                        os.mkdir(target, 0o755)
                    else:
                        os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
                    # the bind keeps the source mount's flags (read-only after `read_only`)
                    _mount(libc, f"/proc/self/fd/{source}", target, None, _MS_BIND | _MS_REC)
                hidden.append(path)
                covers.append(path)
            elif kind == "hide" and os.path.exists(path) and not os.path.isdir(path):
                # a file reads as empty, a unix socket refuses connections (no nodev remount)
                _mount(libc, "/dev/null", path, None, _MS_BIND)
            elif os.path.isdir(path):  # a path already covered by a shallower tmpfs is gone: skip
                if kind == "hide":
                    _mount(
                        libc, "tmpfs", path, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=1m"
                    )
                    hidden.append(path)
                else:
                    _mount(
                        libc,
                        "tmpfs",
                        path,
                        "tmpfs",
                        _MS_NOSUID | _MS_NODEV,
                        f"mode=1777,size={_PRIVATE_TMP_BYTES}",
                    )
                covers.append(path)
        for path in hidden:
            _mount(
                libc, None, path, None, _MS_REMOUNT | _MS_BIND | _MS_NOSUID | _MS_NODEV | _MS_RDONLY
            )
        os.chdir(cwd)  # the working folder as this namespace shows it (e.g. its writable bind)
    finally:
        for fd, _writable in binds.values():
            os.close(fd)
        for listed in entries.values():
            for _name, source in listed:
                if isinstance(source, int):
                    os.close(source)


def probe_mount_namespace() -> str | None:
    """None if this process may build a mount namespace (`enter_mount_namespace`), else why not.

    Forks a child that tries (unshare, a private tmpfs, `mount_setattr`) and reports back; the
    caller's own namespace is untouched."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            os.chdir("/")  # the caller's folder may sit under the probed /tmp (a checkout in /tmp)
            enter_mount_namespace(
                {"read_only": True, "hide": ["/mnt"], "private": ["/tmp"], "expose": ["/tmp"]}
            )
            os._exit(0)
        except BaseException as exc:  # noqa: BLE001 - report any failure to the parent
            os.write(write, str(exc).encode()[:500])
            os._exit(1)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        reason = f.read().decode(errors="replace")
    _, wstatus = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(wstatus) == 0:
        return None
    return reason or f"probe exited with status {os.waitstatus_to_exitcode(wstatus)}"


def _load_relay():
    """`relay.py` beside this file (a script run with -I has no package to import it from)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "relay.py")
    spec = importlib.util.spec_from_file_location("gyre_relay", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> int:
    """Settings JSON: the `Limits` fields; optionally `uid` and `gid` to run the command as, and
    `mounts` (see `enter_mount_namespace`; `"network": false` adds an empty network namespace).
    `--probe-mounts` alone: exit 0 if a mount namespace can be built, else print why and exit 1.
    `relay` (`gyre.sandbox.network.Relay`): the child enters a network namespace of its own first
    (`relay.py`'s `seal`) and this process relays its loopback listeners to the target (`serve`)."""
    if argv == ["--probe-mounts"]:
        reason = probe_mount_namespace()
        if reason is not None:
            sys.stderr.write(reason + "\n")
        return 0 if reason is None else 1
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
    relay = limits.get("relay")
    channels: tuple[socket.socket, socket.socket] | None = None  # (ours, the child's)
    if relay is not None:
        relay_module = _load_relay()
        channels = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    child = os.fork()
    if child == 0:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            if channels is not None:
                channels[0].close()
                relay_module.seal(relay["listen"], channels[1])
            if limits.get("mounts") is not None:
                enter_mount_namespace(limits["mounts"])
                if (
                    limits["mounts"].get("network") is False
                ):  # its own network namespace: not even lo is up
                    _check(_libc().unshare(_CLONE_NEWNET), "unshare(CLONE_NEWNET)")
            _apply_limits(limits)
            if limits.get("uid") is not None:
                _drop_user(int(limits["uid"]), int(limits["gid"]))
            os.execvp(command[0], command)
        except BaseException as exc:  # noqa: BLE001 - report any exec failure and exit
            os.write(2, f"gyre supervisor: cannot run {command[0]!r}: {exc}\n".encode())
        os._exit(127)
    if channels is not None:
        channels[1].close()
        relay_module.serve(channels[0], relay["target"])
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
