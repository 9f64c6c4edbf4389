"""A sealed network for a supervised command: its own network namespace, one way out.

Owns `seal` (run in the command's child: a new network namespace, inside a user namespace of its
own unless we are root, with only loopback up and the listening sockets of `listen` bound in it,
handed to the supervisor), `serve` (run in the
supervisor, which stays in the node's namespace: accepts on those sockets and relays each
connection, bytes both ways, to one `target` address of the node) and `probe` (whether this
process may do so). Standard library only: `supervisor.py` loads it by path. Knows nothing about
HTTP, agents or which address is worth reaching; `gyre.sandbox.network` describes the relay.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import selectors
import socket
import struct
import sys
import threading
import time
from typing import cast

__all__ = ["bring_up_loopback", "probe", "seal", "serve"]

_CLONE_NEWNET, _CLONE_NEWUSER = 0x40000000, 0x10000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_IFREQ = "16sH22x"  # struct ifreq: name, then ifr_flags in the 24-byte union
_CHUNK_BYTES = 1 << 16
"""Most bytes read from one side at once; a side's backlog above it pauses reading its peer."""


def bring_up_loopback() -> None:
    """Set `lo` of the calling thread's network namespace up (127.0.0.1 and ::1 then answer)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        got = fcntl.ioctl(s, _SIOCGIFFLAGS, struct.pack(_IFREQ, b"lo", 0))
        flags = struct.unpack(_IFREQ, got)[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))


def _listener(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def _unshare_network() -> None:
    """A new network namespace for the calling process: as root directly (CAP_SYS_ADMIN); as
    another user inside a new user namespace that maps that user to itself alone (its
    capabilities there end at its next exec, since it is not uid 0 there)."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.geteuid(), os.getegid()
    flags = _CLONE_NEWNET if uid == 0 else _CLONE_NEWUSER | _CLONE_NEWNET
    if libc.unshare(flags) != 0:
        errno = ctypes.get_errno()
        what = "CLONE_NEWNET" if uid == 0 else "CLONE_NEWUSER | CLONE_NEWNET"
        raise OSError(errno, f"unshare({what}): {os.strerror(errno)}")
    if uid != 0:
        for name, text in (
            ("setgroups", "deny"),
            ("uid_map", f"{uid} {uid} 1"),
            ("gid_map", f"{gid} {gid} 1"),
        ):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)


def seal(listen: list[list], channel: socket.socket | None) -> None:
    """Move the calling process into a new network namespace (`_unshare_network`) with `lo` up,
    bind a listening TCP socket at each `[host, port]` of `listen` (loopback addresses) and send
    them over the unix `channel` to the supervisor (then closed here: only the supervisor
    accepts). Raises `OSError` when a step fails; the caller must not run the command then."""
    _unshare_network()
    bring_up_loopback()
    listeners = [_listener(str(host), int(port)) for host, port in listen]
    try:
        if channel is not None:
            socket.send_fds(channel, [b"L"], [s.fileno() for s in listeners])
    finally:
        for sock in listeners:
            sock.close()
        if channel is not None:
            channel.close()


class _Side:
    """One socket of a relayed connection and the bytes waiting to be written to it."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.pending = bytearray()
        self.read_eof = False  # it sent its last byte
        self.write_shut = False  # we sent it EOF (its peer's EOF, once `pending` drained)
        self.connecting = False  # a connection to the target not established yet
        self.peer: _Side = self

    def events(self) -> int:
        if self.connecting:
            return selectors.EVENT_WRITE
        read = not self.read_eof and len(self.peer.pending) < _CHUNK_BYTES
        write = selectors.EVENT_WRITE if self.pending else 0
        return (selectors.EVENT_READ if read else 0) | write


def _connect(target: tuple[str, int], resolved: list) -> socket.socket:
    """A non-blocking connection to `target` under way (its first address, resolved once and
    kept in `resolved`). Raises `OSError` when it fails at once."""
    if not resolved:
        resolved += socket.getaddrinfo(*target, type=socket.SOCK_STREAM)
    family, kind, proto, _name, address = resolved[0]
    sock = socket.socket(family, kind, proto)
    sock.setblocking(False)
    err = sock.connect_ex(address)
    if err not in (0, errno.EINPROGRESS):
        sock.close()
        raise OSError(err, os.strerror(err))
    return sock


def _relay(listeners: list[socket.socket], target: tuple[str, int]) -> None:
    """Accept on `listeners` forever; relay each connection to a fresh one to `target` (its
    connection is made without blocking the others)."""
    resolved: list = []
    sel = selectors.DefaultSelector()
    for sock in listeners:
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ, None)

    def update(side: _Side) -> None:
        events = side.events()
        registered = side.sock in sel.get_map()
        if events and registered:
            sel.modify(side.sock, events, side)
        elif events:
            sel.register(side.sock, events, side)
        elif registered:
            sel.unregister(side.sock)

    def close(side: _Side) -> None:
        for s in (side, side.peer):
            if s.sock in sel.get_map():
                sel.unregister(s.sock)
            s.sock.close()

    while True:
        for key, mask in sel.select():
            if key.data is None:  # a listener: a new connection from inside
                try:
                    # data None: one of `listeners`, registered above as a socket
                    inner, _addr = cast(socket.socket, key.fileobj).accept()
                except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                    continue
                except OSError:  # out of descriptors or memory: the client waits in the backlog
                    time.sleep(0.1)
                    continue
                try:
                    outer = _connect(target, resolved)
                except OSError:
                    inner.close()  # the target is down: the client sees its connection closed
                    continue
                a, b = _Side(inner), _Side(outer)
                a.peer, b.peer, b.connecting = b, a, True
                update(a)
                update(b)
                continue
            side: _Side = key.data
            if side.sock.fileno() < 0:
                continue  # closed earlier in this round
            try:
                if side.connecting:
                    err = side.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        raise OSError(err, os.strerror(err))  # the target refused: both go
                    side.connecting = False
                if mask & selectors.EVENT_READ:
                    data = side.sock.recv(_CHUNK_BYTES)
                    if data:
                        side.peer.pending += data
                    else:
                        side.read_eof = True
                for s in (side, side.peer):
                    if s.connecting:
                        continue
                    if s.pending:
                        sent = s.sock.send(s.pending)
                        del s.pending[:sent]
                    if s.peer.read_eof and not s.pending and not s.write_shut:
                        s.sock.shutdown(socket.SHUT_WR)
                        s.write_shut = True
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:  # reset or broken pipe: both ends go
                close(side)
                continue
            if side.write_shut and side.peer.write_shut:
                close(side)
                continue
            update(side)
            update(side.peer)


def serve(channel: socket.socket, target: list) -> threading.Thread | None:
    """In the supervisor: receive the listening sockets `seal` sent over `channel` and relay
    their connections to `target` = `[host, port]` (reached from the supervisor's own network
    namespace) on a daemon thread, which ends with the process. None if the child sent none (it
    failed to seal and exits 127)."""
    try:
        _msg, fds, _flags, _addr = socket.recv_fds(channel, 16, 16)
    finally:
        channel.close()
    if not fds:
        return None
    listeners = [socket.socket(fileno=fd) for fd in fds]
    thread = threading.Thread(
        target=_relay,
        args=(listeners, (str(target[0]), int(target[1]))),
        name="gyre-relay",
        daemon=True,
    )
    thread.start()
    return thread


def probe() -> str | None:
    """None if this process may `seal` (a network namespace, lo up, a port bound), else why not.
    Changes the calling process's namespace: run it in a throwaway process (`--probe`)."""
    try:
        seal([["127.0.0.1", 0]], None)
    except OSError as exc:
        return str(exc)
    return None


if __name__ == "__main__":
    if sys.argv[1:] != ["--probe"]:
        sys.stderr.write("usage: relay.py --probe\n")
        sys.exit(2)
    reason = probe()
    if reason is not None:
        sys.stderr.write(reason + "\n")
    sys.exit(0 if reason is None else 1)
