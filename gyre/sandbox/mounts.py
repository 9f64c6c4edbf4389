"""The filesystem a supervised command sees: a private mount namespace, described and probed.

Owns `Mounts` (what is hidden, private, passed through, shown and writable) and
`mount_namespace_problem` (whether this node can build such a namespace at all, probed once per
process). The namespace itself is entered by `gyre/sandbox/supervisor.py` in the command's child;
which folders an agent or a verifier should see is the harness's policy
(`gyre.agents.isolation`). Knows nothing about tasks, agents or processes' lifetimes. Linux only.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgspec

from gyre.sandbox import supervisor

__all__ = ["Mounts", "mount_namespace_problem"]

_SUPERVISOR = str(Path(supervisor.__file__).resolve())


class Mounts(msgspec.Struct, frozen=True, kw_only=True):
    """The filesystem a supervised command sees: a private mount namespace (needs root with
    CAP_SYS_ADMIN; see `supervisor.enter_mount_namespace`). Absolute paths; missing ones are
    skipped.

    Shallowest path first: a folder in `expose` under one in `hide` is visible, a folder in `hide`
    under one in `expose` is not."""

    hide: tuple[str, ...] = ()
    """Folders covered by an empty read-only tmpfs, files by /dev/null: their content cannot be
    reached."""
    private: tuple[str, ...] = ()
    """Folders covered by a fresh writable tmpfs (1777) that dies with the command (/tmp)."""
    traverse: tuple[str, ...] = ()
    """Folders other users cannot enter (0700) that the command passes through as if they had
    o+x (the folder of a `mktemp -d` checkout): what lies below keeps its own modes."""
    expose: tuple[str, ...] = ()
    """Folders shown read-only at their own path even under a hidden one (the interpreter)."""
    writable: tuple[str, ...] = ()
    """Folders shown writable at their own path (the workspace), even under `read_only`."""
    read_only: bool = False
    """Every other mount read-only: the command writes only to `writable` and `private`."""
    network: bool = True
    """False: the command also gets a network namespace of its own, with no interface up (not
    even loopback): it reaches nothing, on this node or off it (verifiers)."""

    def __post_init__(self) -> None:
        for name in ("hide", "private", "traverse", "expose", "writable"):
            for path in getattr(self, name):
                if not os.path.isabs(path) or os.path.normpath(path) != path or path == "/":
                    raise ValueError(
                        f"{name}: {path!r} must be a normalised absolute path other than /"
                    )


_probe: list[str | None] = []


def mount_namespace_problem() -> str | None:
    """None if commands can run with `Mounts` here (root, CAP_SYS_ADMIN, Linux >= 5.12), else why
    not. Probed once per process in a throwaway child (`supervisor.py --probe-mounts`)."""
    if not _probe:
        if os.geteuid() != 0:
            _probe.append(f"the node runs as uid {os.geteuid()}, not root")
        else:
            done = subprocess.run(
                [sys.executable, "-I", "-S", _SUPERVISOR, "--probe-mounts"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            _probe.append(
                None if done.returncode == 0 else done.stderr.strip() or f"status {done.returncode}"
            )
    return _probe[0]
