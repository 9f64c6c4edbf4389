"""Whether this node can run commands as other users: the uids a supervised command may become.

Owns `uid_switch_problem`: a node that is root may still be unable to hand a command another
uid, and an euid of 0 alone does not say so. Root in a user namespace (`unshare -r`, a rootless
container) maps only the uids of its `/proc/self/uid_map`, and root without CAP_SETUID,
CAP_SETGID or CAP_CHOWN (a container that drops them) can neither become another user nor give
it files. The supervisor (`supervisor.py`) makes the switch; which uids agents get is the
harness's policy (`gyre.agents.isolation`). Knows nothing about tasks or agents. Linux only.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Sequence

__all__ = ["uid_switch_problem"]

_probes: dict[tuple[range, ...], str | None] = {}


def _unmapped(ids: range, map_path: str) -> int | None:
    """The first of `ids` that `map_path` (`/proc/self/uid_map` or `gid_map`: lines of `inside
    outside count`) does not map into this user namespace; None if it maps all of them."""
    with open(map_path, encoding="ascii") as f:
        spans = sorted(
            (int(inside), int(inside) + int(count))
            for inside, _outside, count in (line.split() for line in f if line.strip())
        )
    need = ids.start
    for start, stop in spans:
        if start <= need < stop:
            need = stop
        if need >= ids.stop:
            return None
    return need


def _switch_problem(uid: int) -> str | None:
    """Why this process cannot give a file to `uid` (gid = uid) or start a command as it with no
    supplementary groups, as the harness and the supervisor do; None if it can."""
    with tempfile.NamedTemporaryFile() as f:
        try:
            os.chown(f.name, uid, uid)
        except OSError as exc:
            return f"cannot give a file to uid {uid}: {exc.strerror}"
    try:
        subprocess.run(
            ["/bin/sh", "-c", ":"],
            user=uid,
            group=uid,
            extra_groups=[],
            check=True,
            capture_output=True,
            timeout=30,
        )
    except OSError as exc:  # failed before the exec: the switch itself
        if exc.filename is None:
            return f"cannot run a command as uid {uid}: {exc.strerror or exc}"
    except subprocess.CalledProcessError:
        pass  # the switch worked; /bin/sh then failed as that user (not our question)
    return None


def uid_switch_problem(ids: Sequence[range]) -> str | None:
    """None if this process can run commands as every uid in `ids` (each id also its own gid,
    with no supplementary groups) and give files to them, else why not, in words: not root, an
    id this user namespace does not map (`"uid 200000 is not mapped in the node's user namespace
    (/proc/self/uid_map: 0 0 1)"`), or a switch the kernel refuses (no CAP_SETUID, CAP_SETGID or
    CAP_CHOWN). The map is read for the whole of each range; the switch is tried, in a throwaway
    child, for the first id of each. Probed once per process for the same `ids`."""
    key = tuple(ids)
    if key not in _probes:
        _probes[key] = _problem(key)
    return _probes[key]


def _problem(ids: tuple[range, ...]) -> str | None:
    if os.geteuid() != 0:
        return f"the node runs as uid {os.geteuid()}, not root"
    for kind in ("uid", "gid"):
        path = f"/proc/self/{kind}_map"
        for span in ids:
            missing = _unmapped(span, path)
            if missing is not None:
                with open(path, encoding="ascii") as f:
                    shown = "; ".join(" ".join(line.split()) for line in f if line.strip())
                where = f"the node's user namespace ({path}: {shown})"
                return f"{kind} {missing} is not mapped in {where}"
    for span in ids:
        problem = _switch_problem(span.start)
        if problem is not None:
            return problem
    return None
