"""The sealed verifier's trusted side: a pytest run that never imports the workspace's code.

Run as a script (`python -I sealed.py <pytest args>`, copied with `gyre/sandbox/pyhost.py` into
the verifier's scratch; standard library and pytest only). Non-dumpable (no process of its uid
reads its memory or descriptors), it answers imports of the workspace's top-level names with
`_RemoteModule`s (a finder last on `sys.meta_path`) and writes each test phase as a JSON line,
signed with the key read from `GYRE_KEY_FD`, to the scorer's pipe `GYRE_REPORT_FD`. The
workspace's code runs in workers of the Python host (`GYRE_HOST_FD`, another process, usually
another uid); only plain data comes back, so every assertion is evaluated here. Knows nothing
about tasks, scores or gyre (`gyre.tasks.scorer` starts it).
"""

from __future__ import annotations

import builtins
import ctypes
import hmac
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import socket
import struct
import sys
import types

_PR_SET_DUMPABLE = 4


def _load_pyhost() -> types.ModuleType:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyhost.py")
    spec = importlib.util.spec_from_file_location("_gyre_pyhost", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class WorkspaceExit(Exception):
    """The workspace's code raised SystemExit, KeyboardInterrupt or another non-Exception."""


class _Host:
    """The connection to the Python host: one worker at a time, replaced when it fails."""

    def __init__(self, fd: int, timeout_s: float) -> None:
        self.wire = _load_pyhost()
        self.ctrl = socket.socket(fileno=fd)
        self.timeout_s = timeout_s
        self.worker: tuple[socket.socket, int] | None = None
        self.generation = 0
        self.exceptions: dict[tuple[str, str], type] = {}

    def _spawn(self) -> tuple[socket.socket, int]:
        self.wire.send_frame(self.ctrl, {"op": "spawn"})
        data, fds, _flags, _addr = socket.recv_fds(self.ctrl, 4, 1)
        if len(data) != 4 or len(fds) != 1:
            raise RuntimeError("the Python host did not start a worker")
        sock = socket.socket(fileno=fds[0])
        sock.settimeout(self.timeout_s)
        return sock, struct.unpack(">I", data)[0]

    def discard(self) -> None:
        if self.worker is not None:
            sock, pid = self.worker
            self.worker = None
            self.generation += 1
            sock.close()
            try:
                self.wire.send_frame(self.ctrl, {"op": "kill", "pid": pid})
            except OSError:
                pass

    def request(self, op: str, target: _Remote | None = None, *, path: bool = False, **fields):
        """Send one request to the worker; the reply decoded (references as `_Remote`s, path-based
        ones when `path`), or the workspace's exception raised as a local class."""
        message: dict = {"op": op, **fields}
        if target is not None:
            message["target"] = _tagged(target)
        message["args"] = [self.wire.encode(a, _tag) for a in fields.get("args", ())]
        kwargs = fields.get("kwargs", {})
        message["kwargs"] = {k: self.wire.encode(v, _tag) for k, v in kwargs.items()}
        if self.worker is None:
            self.worker = self._spawn()
        generation = self.generation
        try:
            self.wire.send_frame(self.worker[0], message)
            reply = self.wire.recv_frame(self.worker[0])
        except TimeoutError:
            self.discard()
            raise TimeoutError(
                f"the workspace's code did not answer within {self.timeout_s} s"
            ) from None
        except EOFError:
            self.discard()
            raise WorkspaceExit(
                "the workspace's process ended during the call (exit or crash)"
            ) from None
        except BaseException:  # interrupted (pytest-timeout) or garbled: never reuse this worker
            self.discard()
            raise
        if "raise" in reply:
            raise self.exception(reply["raise"])

        value = reply["ok"]
        if path and isinstance(value, dict) and "obj" in value and "path" in message["target"]:
            # an attribute of a module, reached by name: valid in any later worker too
            return _Remote({"path": [*message["target"]["path"], fields["name"]]}, None)

        def ref(tagged: dict) -> object:
            if "exc" in tagged:
                return self.exception_class(tagged["exc"])
            if "mod" in tagged:
                return _import_or_remote(tagged["mod"])
            return _Remote({"obj": tagged["obj"]}, generation)

        return self.wire.decode(value, ref)

    def exception_class(self, chain: list[list[str]]) -> type:
        module, name = chain[-1]
        base = getattr(builtins, name, None) if module == "builtins" else None
        if not (isinstance(base, type) and issubclass(base, Exception)):
            base = WorkspaceExit
        for module, qualname in reversed(chain[:-1]):
            key = (module, qualname)
            if key not in self.exceptions:
                self.exceptions[key] = type(
                    qualname.rsplit(".", 1)[-1],
                    (base,),
                    {"__module__": module, "__qualname__": qualname},
                )
            base = self.exceptions[key]
        return base

    def exception(self, raised: dict) -> BaseException:
        cls = self.exception_class(raised["chain"])
        try:
            return cls(*raised["args"])
        except Exception:  # noqa: BLE001 - a class whose constructor wants other arguments
            return cls(raised["str"])


HOST: _Host | None = None


def _host() -> _Host:
    if HOST is None:
        raise RuntimeError("the sealed verifier has no Python host")
    return HOST


def _tag(value: object) -> dict:
    if isinstance(value, _Remote):
        return _tagged(value)
    raise TypeError(
        f"a {type(value).__name__} cannot be passed to the workspace's code (plain data only)"
    )


def _import_or_remote(name: str) -> object:
    """A module the workspace's code handed over by name: the judge's own copy when the judge
    has imported it already, else a reference to the worker's. Never imported here: the name is
    the workspace's choice, and a module it planted on the judge's path (the scratch `tests/`
    folder is on it, and unisolated agents share the node's uid) would run in the judge."""
    module = sys.modules.get(name)
    return module if module is not None else _Remote({"path": [name]}, None)


_PLAIN_DUNDERS = ("__name__", "__qualname__", "__doc__", "__module__", "__all__", "__version__")


def _tagged(remote: _Remote) -> dict:
    """The worker's reference of `remote` (a module function, not a method: every attribute of a
    `_Remote` is the workspace object's). Raises `ReferenceError` once its process has ended."""
    generation = object.__getattribute__(remote, "_gyre_generation")
    if generation is not None and generation != _host().generation:
        raise ReferenceError("an object of a workspace process that has ended")
    return object.__getattribute__(remote, "_gyre_target")


class _Remote:
    """An object of the workspace's code, living in the worker: every use is a request.

    Never equal to plain data, never ordered against it, and holds a value only if one of its
    items equals it here (an object cannot claim to match an expected value); two remote objects
    compare in the worker."""

    __slots__ = ("_gyre_target", "_gyre_generation")

    def __init__(self, target: dict, generation: int | None) -> None:
        object.__setattr__(self, "_gyre_target", target)
        object.__setattr__(self, "_gyre_generation", generation)

    def __getattr__(self, name: str):
        if name.startswith("__") and name not in _PLAIN_DUNDERS:
            raise AttributeError(name)
        return _host().request("getattr", self, path=True, name=name)

    def __setattr__(self, name: str, value: object) -> None:
        _host().request("setattr", self, name=name, args=[value])

    def __call__(self, *args, **kwargs):
        return _host().request("call", self, args=args, kwargs=kwargs)

    def __repr__(self) -> str:
        try:
            return str(_host().request("repr", self))
        except Exception:  # noqa: BLE001 - repr must not fail (pytest's reports call it)
            return f"<workspace object {self._gyre_target}>"

    def __str__(self) -> str:
        return str(_host().request("str", self))

    def __eq__(self, other: object):
        return _host().request("op_eq", self, args=[other]) if isinstance(other, _Remote) else False

    def __ne__(self, other: object):
        return _host().request("op_ne", self, args=[other]) if isinstance(other, _Remote) else True

    def __hash__(self) -> int:
        return int(_host().request("hash", self))

    def __len__(self) -> int:
        return int(_host().request("len", self))

    def __bool__(self) -> bool:
        return bool(_host().request("bool", self))

    def __iter__(self):
        return _host().request("iter", self)

    def __next__(self):
        return _host().request("next", self)

    def __contains__(self, item: object) -> bool:
        """`item in obj`: asked of the worker for a workspace object; for plain data, the items
        are fetched and compared here (a container cannot claim to hold every value)."""
        if isinstance(item, _Remote):
            return bool(_host().request("op_contains", self, args=(item,)))
        return any(element == item for element in iter(self))

    def __instancecheck__(self, instance: object) -> bool:  # isinstance(x, workspace_class)
        return isinstance(instance, _Remote) and bool(
            _host().request("isinstance", self, args=[instance])
        )


def _operator(name: str):
    def forward(self: _Remote, *args):
        return _host().request(f"op_{name}", self, args=args)

    forward.__name__ = f"__{name}__"
    return forward


def _ordering(name: str):
    def forward(self: _Remote, other: object):
        if not isinstance(other, _Remote):  # an object cannot claim an order against a value
            raise TypeError(f"a workspace object is not ordered against a {type(other).__name__}")
        return _host().request(f"op_{name}", self, args=(other,))

    forward.__name__ = f"__{name}__"
    return forward


for _name in (
    "add",
    "sub",
    "mul",
    "truediv",
    "floordiv",
    "mod",
    "pow",
    "neg",
    "getitem",
    "setitem",
    "delitem",
):
    setattr(_Remote, f"__{_name}__", _operator(_name))
for _name in ("lt", "le", "gt", "ge"):
    setattr(_Remote, f"__{_name}__", _ordering(_name))


class _RemoteModule(types.ModuleType):
    """A module of the workspace: its attributes are fetched from the worker (data by value)."""

    def __getattr__(self, name: str):
        if name.startswith("__") and name not in _PLAIN_DUNDERS:
            raise AttributeError(name)
        module = _Remote({"path": [self.__name__]}, None)
        return _host().request("getattr", module, path=True, name=name)


class _WorkspaceFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on `sys.meta_path`: a module the workspace defines (and nothing installed does)."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] not in self.names:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        _host().request("import", name=spec.name)  # raises ModuleNotFoundError as the worker does
        module = _RemoteModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module) -> None:
        pass


def workspace_names(folder: str) -> set[str]:
    """Top-level names `folder` could be imported by: folders, and modules' stems."""
    names = set()
    for entry in os.listdir(folder):
        stem, _, suffix = entry.partition(".")
        if stem.isidentifier() and (not suffix or suffix.endswith(("py", "pyc", "so", "pyd"))):
            names.add(stem)
    return names


def sign(key: bytes, body: str) -> str:
    """The report line of `body`: `body`, a space, and its HMAC-SHA256 under `key` (hex)."""
    return f"{body} {hmac.new(key, body.encode(), 'sha256').hexdigest()}"


class _Reporter:
    """Writes one signed JSON line per test phase to the scorer's pipe."""

    def __init__(self, fd: int, key: bytes) -> None:
        self.fd = fd
        self.key = key

    def write(self, record: dict) -> None:
        data = (sign(self.key, json.dumps(record)) + "\n").encode()
        while data:
            data = data[os.write(self.fd, data) :]

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self.write({"id": report.nodeid, "when": "collect", "outcome": "failed"})

    def pytest_runtest_logreport(self, report) -> None:
        self.write({"id": report.nodeid, "when": report.when, "outcome": report.outcome})

    def pytest_sessionfinish(self, session, exitstatus) -> None:
        self.write({"done": int(exitstatus)})


def main(argv: list[str]) -> int:
    global HOST
    ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    # read before any worker exists: the pipe is empty from then on, the key only in this memory
    key_fd = int(os.environ["GYRE_KEY_FD"])
    key = os.read(key_fd, 64)
    os.close(key_fd)
    HOST = _Host(int(os.environ["GYRE_HOST_FD"]), float(os.environ["GYRE_CALL_TIMEOUT_S"]))
    sys.meta_path.append(_WorkspaceFinder(workspace_names(os.environ["GYRE_WORKSPACE"])))
    import pytest

    reporter = _Reporter(int(os.environ["GYRE_REPORT_FD"]), key)
    return int(pytest.main(argv, plugins=[reporter]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
