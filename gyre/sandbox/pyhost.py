"""The Python host: the only process that imports and runs untrusted code for a trusted caller.

Run as a script (`python -I -S pyhost.py <fd> <folder>`; standard library only): a zygote that
never imports the untrusted code serves a trusted caller on the inherited socket `<fd>`; each
`spawn` forks a worker (its socket handed over with SCM_RIGHTS) that puts `<folder>` at the end
of `sys.path` and answers calls on it: import, getattr, call, operators. Owns the wire: frames
(`send_frame`, `recv_frame`) of tagged JSON (`encode`, `decode`), which carry plain data by value
(exact builtin types only) and everything else as a reference the worker keeps. Knows nothing
about tests, scores or pytest; the trusted side is `gyre.tasks.sealed`.
"""

from __future__ import annotations

import base64
import builtins
import importlib
import json
import operator
import os
import signal
import socket
import struct
import sys
from collections.abc import Callable
from typing import Any

MAX_FRAME_BYTES = 64 << 20
"""Largest frame either side accepts, bytes."""

_SCALARS = (type(None), bool, int, float, str)
_BUILTIN_OPS: dict[str, Callable[[Any], Any]] = {  # on any object: each raises what it raises
    "iter": iter,
    "len": len,
    "bool": bool,
    "str": str,
    "repr": repr,
    "hash": hash,
}


def encode(value: object, keep=None) -> object:
    """`value` as JSON-ready tagged data. Exact builtin types travel by value, modules as
    {"mod": name}, exception classes as {"exc": chain}; any other object as `keep(value)` (a
    tagged reference such as {"obj": id}), or `TypeError` without `keep`."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if type(value) is list:
        return [encode(v, keep) for v in value]
    if type(value) is tuple:
        return {"t": [encode(v, keep) for v in value]}
    if type(value) is set or type(value) is frozenset:
        return {"s" if kind is set else "fs": [encode(v, keep) for v in value]}
    if type(value) is dict:
        return {"d": [[encode(k, keep), encode(v, keep)] for k, v in value.items()]}
    if type(value) is bytes:
        return {"b": base64.b64encode(value).decode()}
    if keep is None:
        raise TypeError(f"a {kind.__name__} cannot cross the sealed verifier (plain data only)")
    if isinstance(value, type(sys)):
        return {"mod": value.__name__}
    if isinstance(value, type) and issubclass(value, BaseException):
        return {"exc": exception_chain(value)}
    return keep(value)


def decode(data: object, ref=None) -> object:
    """Inverse of `encode`; `ref(tagged)` turns a tagged non-data value into an object."""
    if type(data) in _SCALARS:
        return data
    if type(data) is list:
        return [decode(v, ref) for v in data]
    if type(data) is not dict or len(data) != 1:
        raise ValueError(f"not a sealed-wire value: {str(data)[:80]}")
    ((tag, body),) = data.items()
    if tag == "t":
        return tuple(decode(v, ref) for v in body)
    if tag in ("s", "fs"):
        items = (decode(v, ref) for v in body)
        return set(items) if tag == "s" else frozenset(items)
    if tag == "d":
        return {decode(k, ref): decode(v, ref) for k, v in body}
    if tag == "b":
        return base64.b64decode(body)
    if ref is None:
        raise ValueError(f"unexpected reference {tag!r} in plain data")
    return ref(data)


def exception_chain(cls: type) -> list[list[str]]:
    """[module, qualname] of `cls` and its bases, down to the first builtin exception."""
    chain = []
    for base in cls.__mro__:
        chain.append([base.__module__, base.__qualname__])
        if base.__module__ == "builtins":
            break
    return chain


def send_frame(sock: socket.socket, message: object) -> None:
    body = json.dumps(message).encode()
    sock.sendall(struct.pack(">I", len(body)) + body)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("the peer closed the sealed-verifier socket")
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket) -> Any:
    """One frame (its decoded JSON); `EOFError` when the peer is gone, `ValueError` for an
    oversized frame."""
    (size,) = struct.unpack(">I", _recv_exact(sock, 4))
    if size > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {size} bytes > MAX_FRAME_BYTES={MAX_FRAME_BYTES}")
    return json.loads(_recv_exact(sock, size))


class _Worker:
    """Answers calls on its socket: every object it hands out by reference is kept in `objects`."""

    def __init__(self) -> None:
        self.objects: dict[int, object] = {}

    def keep(self, value: object) -> dict:
        self.objects[id(value)] = value
        return {"obj": id(value)}

    def resolve(self, tagged: dict) -> object:
        if "obj" in tagged:
            return self.objects[tagged["obj"]]
        if "path" in tagged:  # [module, attr, attr, ...]: survives a new worker
            module, *attrs = tagged["path"]
            value: object = importlib.import_module(module)
            for name in attrs:
                value = self.attr(value, name)
            return value
        if "mod" in tagged:
            return importlib.import_module(tagged["mod"])
        if "exc" in tagged and tagged["exc"][0][0] == "builtins":
            return getattr(builtins, tagged["exc"][0][1])
        raise ValueError(f"cannot resolve {tagged!r}")

    @staticmethod
    def attr(value: object, name: str) -> object:
        try:
            return getattr(value, name)
        except AttributeError:
            if isinstance(value, type(sys)):  # a submodule not imported yet
                return importlib.import_module(f"{value.__name__}.{name}")
            raise

    def handle(self, request: dict) -> object:
        args = [decode(a, self.resolve) for a in request.get("args", [])]
        kwargs = {k: decode(v, self.resolve) for k, v in request.get("kwargs", {}).items()}
        op = request["op"]
        if op == "import":
            importlib.import_module(request["name"])
            return None
        # any object of the workspace: each operation raises what Python raises for it
        target: Any = self.resolve(request["target"])
        if op == "getattr":
            return self.attr(target, request["name"])
        if op == "setattr":
            setattr(target, request["name"], args[0])
            return None
        if op == "call":
            return target(*args, **kwargs)
        if op == "next":
            return next(target)
        if op == "isinstance":
            return isinstance(args[0], target)
        if op in ("str", "repr"):  # an exact str, even if __str__ returned a subclass
            return (
                _BUILTIN_OPS[op](target)
                .encode("utf-8", "surrogatepass")
                .decode("utf-8", "surrogatepass")
            )
        if op in _BUILTIN_OPS:
            return _BUILTIN_OPS[op](target)
        if op.startswith("op_") and hasattr(operator, op[3:]):
            return getattr(operator, op[3:])(target, *args)
        raise ValueError(f"unknown operation {op!r}")

    def serve(self, sock: socket.socket) -> None:
        while True:
            try:
                request = recv_frame(sock)
            except EOFError:
                return
            try:
                reply: dict = {"ok": encode(self.handle(request), self.keep)}
            except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
                args = exc.args if all(type(a) in _SCALARS for a in exc.args) else (str(exc),)
                reply = {
                    "raise": {
                        "chain": exception_chain(type(exc)),
                        "args": list(args),
                        "str": str(exc)[:2000],
                    }
                }
            send_frame(sock, reply)


def main(argv: list[str]) -> int:
    """Zygote: `spawn` forks a worker and sends its socket back with its pid; `kill` ends one."""
    ctrl = socket.socket(fileno=int(argv[0]))
    folder = argv[1]
    os.umask(0o007)  # the verifier's uid (the group) may change what the code writes
    workers: set[int] = set()
    while True:
        try:
            request = recv_frame(ctrl)
        except EOFError:
            break
        if request["op"] == "spawn":
            mine, theirs = socket.socketpair()
            pid = os.fork()
            if pid == 0:
                ctrl.close()
                theirs.close()
                sys.path.append(folder)
                _Worker().serve(mine)
                os._exit(0)
            mine.close()
            workers.add(pid)
            socket.send_fds(ctrl, [struct.pack(">I", pid)], [theirs.fileno()])
            theirs.close()
        elif request["op"] == "kill" and request["pid"] in workers:
            os.kill(request["pid"], signal.SIGKILL)
        for pid in list(workers):
            if os.waitpid(pid, os.WNOHANG)[0]:
                workers.discard(pid)
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
