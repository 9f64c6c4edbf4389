"""Isolation of agents from the node and from each other: own uids, default-deny namespaces.

Owns the harness's isolation policy and its pieces: `agent_namespace` (the mount namespace every
agent starts from), `sealed_endpoint` (the one address an agent's network namespace reaches) and
`node_sockets`, `check_isolation` (the preflight of `require_isolation`; `check_visible_paths`),
`closed_to_others` and `unreachable_executable` (whether a stranger's uid reaches a path, an agent
command's executable, as a namespace shows the tree), `tighten_hidden` and `agent_uid_problem`
(whether root here can switch to agent uids). The uids themselves (`AgentUser`, one held per
execution) and an execution's files handed to one and back (`hand_over` / `hand_back`) are
`gyre.agents.agent_users`'. The `Harness` (`gyre.agents.harness`) applies them per execution; the
mechanics (uids, `Mounts`, `Relay`, namespaces) are `gyre.sandbox`'s. Knows nothing about
processes' lifetimes, HTTP or tokens; of the proxy only its URL.

Isolation (`isolate_uid`, when the node runs as root): each agent runs as its own unprivileged uid
(one held per running execution) with gid = uid and no supplementary groups; its workspace, HOME,
TMPDIR and instruction are chowned to it, the execution folder (0711, root) and its logs (0600)
stay root's, the task's `tests/` and `solution/` are tightened to 0700 before the first run. With
`isolate_mounts` it starts in a private mount namespace that denies by default, and its verifier in
a read-only one without network (`agent_namespace` says what they hide and bind back); with
`isolate_network`, in a network namespace whose one way out is the proxy (`sealed_endpoint`).
`require_isolation` (true by default) refuses what cannot give all three (`check_isolation` says
what; docs/design.md's invariants, the guarantee).
"""

from __future__ import annotations

import ipaddress
import itertools
import logging
import os
import shutil
import stat
import sys
import urllib.parse
from collections.abc import Iterable, Sequence
from pathlib import Path

import msgspec

from gyre.config import HarnessConfig
from gyre.errors import ConfigError
from gyre.sandbox import Mounts, Relay, mount_namespace_problem, network_namespace_problem
from gyre.sandbox.uids import uid_switch_problem
from gyre.tasks.scorer import JUDGE_USER
from gyre.tasks.task import Task

__all__ = [
    "agent_uid_problem",
    "GYRE_DIR",
    "PRIVATE_DIRS",
    "SYSTEM_DIRS",
    "agent_namespace",
    "check_isolation",
    "check_visible_paths",
    "closed_parents",
    "closed_to_others",
    "command_paths",
    "covered_top_level",
    "generator_files",
    "isolation_refused",
    "node_sockets",
    "reach_problem",
    "reach_refused",
    "sealed_endpoint",
    "shown_paths",
    "suite_hidden",
    "tighten_hidden",
    "under",
    "unreachable_executable",
    "unreachable_refused",
    "warn_once",
    "workspace_problem",
]

logger = logging.getLogger(__name__)

GYRE_DIR = Path(__file__).parent.parent
"""The gyre package folder (shown to agents read-only; its suite generator hidden)."""

_warned: set[str] = set()


def warn_once(key: str, message: str, *args: object) -> None:
    """Log `message % args` as a warning the first time `key` is seen in this process."""
    if key not in _warned:
        _warned.add(key)
        logger.warning(message, *args)


def under(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or inside it (absolute normalised paths; no filesystem access)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def closed_parents(paths: Iterable[str]) -> set[str]:
    """The parent folders of `paths` (absolute) that other users cannot traverse (no o+x), e.g.
    the 0700 folder of a `mktemp -d` checkout: an agent's namespace lets it pass through them
    (`Mounts.traverse`), so it reaches the venv, the gyre package, its execution and whatever else
    below them other users may read, as in a checkout whose parents are o+x. Mode bits only; a
    folder not made yet (a run's workspace root before it starts) is not closed."""
    return {
        str(folder)
        for path in paths
        for folder in Path(path).parents
        if folder != Path("/") and folder.is_dir() and not os.stat(folder).st_mode & stat.S_IXOTH
    }


def closed_to_others(path: Path, *, executable: bool, mounts: Mounts | None = None) -> Path | None:
    """The first parent folder of `path` (as given and resolved) that other users cannot
    traverse (no o+x), or `path` itself if `executable` and they cannot read and run it; None if
    an unprivileged stranger reaches it. With `mounts`, as that namespace shows the tree: a folder
    covered by `hide`/`private` is gone, except the parents of an exposed folder (created 0755); a
    folder in `traverse` is passed.
    Mode bits only (ACLs are not consulted)."""
    covers = () if mounts is None else mounts.hide + mounts.private
    shown = () if mounts is None else mounts.expose + mounts.writable
    passed = () if mounts is None else mounts.traverse

    def blocks(folder: Path) -> bool:
        f = str(folder)
        if f in passed:
            return False
        inner = max((c for c in covers + shown if under(f, c)), key=len, default=None)
        if inner is not None and inner in covers and inner not in shown:
            return not any(under(e, f) and e != f and under(e, inner) for e in shown)
        return not os.stat(folder).st_mode & stat.S_IXOTH

    for p in (Path(os.path.abspath(path)), path.resolve()):
        for folder in reversed(p.parents):
            if blocks(folder):
                return folder
    read_run = stat.S_IROTH | stat.S_IXOTH
    if executable and (os.stat(path).st_mode & read_run) != read_run:
        return path
    return None


def suite_hidden(suite: Path) -> set[str]:
    """`tests/` and `solution/` of every task folder in `suite` (folders holding a task.toml)."""
    return {
        os.path.abspath(task / name)
        for task in suite.iterdir()
        if (task / "task.toml").is_file()
        for name in ("tests", "solution")
    }


PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run")
"""Covered by a fresh tmpfs for each agent and each verifier: no channel between executions, no
look at another execution's verifier output, nothing left behind. /run (and /var/run, its link)
too: the node's services keep their unix sockets there, and a socket bound there after the agent
starts, bound again by a restarted service, bound by a relative path or from another network
namespace is not in `node_sockets`' list (found by a tester)."""

SYSTEM_DIRS = frozenset(
    {
        "bin",
        "dev",
        "etc",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "proc",
        "run",
        "sbin",
        "sys",
        "tmp",
        "usr",
        "var",
    }
)
"""The top-level folders an agent's namespace shows (as its uid may read them); every other one
is covered. The Filesystem Hierarchy Standard's system folders, without /boot, /home, /media,
/mnt, /opt, /root and /srv."""


def covered_top_level() -> set[str]:
    """Top-level folders (not symlinks) outside `SYSTEM_DIRS`: /root, /home, /opt, /work, ..."""
    with os.scandir("/") as scan:
        return {
            e.path for e in scan if e.is_dir(follow_symlinks=False) and e.name not in SYSTEM_DIRS
        }


def generator_files(gyre_dir: Path) -> set[str]:
    """The shipped suites' generator, the package `gyre/tasks/suites/` (its bytecode included),
    and the bytecode folder of `gyre/tasks` (present once the node imported gyre.tasks, possibly
    with a stale copy of the generator's; agents then compile those modules in memory): hidden from
    agents, which could otherwise regenerate a shipped suite's hidden tests."""
    return {str(gyre_dir / "tasks" / "suites"), str(gyre_dir / "tasks" / "__pycache__")}


def command_paths(command: Sequence[str], path: str) -> tuple[str, ...]:
    """What an agent command names on this node: its executable (looked up on `path`) and every
    argument that is an absolute path to an existing file or folder, as given and resolved."""
    found = shutil.which(command[0], path=path)
    named = [os.path.abspath(found)] if found else []
    named += [a for a in command[1:] if os.path.isabs(a)]
    paths = {
        q for p in named if os.path.exists(p) for q in (os.path.normpath(p), os.path.realpath(p))
    }
    return tuple(sorted(paths - {"/"}))


def reach_problem(path: Path, *, executable: bool, mounts: Mounts | None) -> str | None:
    """Why an unprivileged stranger cannot reach `path` (`closed_to_others`, as `mounts` shows
    the tree), in words: `"<folder or path> has mode 700"` (mode bits) or `"<folder> is hidden
    in the agents' mount namespace"`; None if it can."""
    closed = closed_to_others(path, executable=executable, mounts=mounts)
    if closed is None:
        return None
    mode = stat.S_IMODE(os.stat(closed).st_mode)
    needed = stat.S_IROTH | stat.S_IXOTH if executable and closed == path else stat.S_IXOTH
    if mode & needed != needed:
        return f"{closed} has mode {mode:o}"
    return f"{closed} is hidden in the agents' mount namespace"


def shown_paths(command: Sequence[str], path: str, hidden: Iterable[str]) -> tuple[str, ...]:
    """`command_paths` but those under a folder in `hidden` (hidden on purpose: `hidden_paths`,
    the run folder, the workspace root, the suites' tests and solutions): what an agent's
    namespace binds back of its command."""
    hidden = tuple(hidden)
    return tuple(p for p in command_paths(command, path) if not any(under(p, h) for h in hidden))


def unreachable_executable(
    command: Sequence[str], path: str, mounts: Mounts | None, hidden: Iterable[str]
) -> str | None:
    """Why the executable of `command` (looked up on `path`) cannot run as an agent uid:
    `"<executable> cannot be reached by other users (<reach_problem>)"`, in `mounts` with
    `shown_paths` bound back (None: mode bits of the node's tree); None if it can, if it is not
    found (it fails to start as any user) or if it is a relative path with a slash (it is
    resolved in the agent's own workspace)."""
    if "/" in command[0] and not os.path.isabs(command[0]):
        return None
    found = shutil.which(command[0], path=path)
    if found is None:
        return None
    view = mounts and msgspec.structs.replace(
        mounts, expose=(*mounts.expose, *shown_paths(command, path, hidden))
    )
    why = reach_problem(Path(found), executable=True, mounts=view)
    return None if why is None else f"{found} cannot be reached by other users ({why})"


def unreachable_refused(problem: str, command: str) -> str:
    """`require_isolation`'s words for `command` (what names it) whose executable cannot run as
    an agent uid (`problem`, from `unreachable_executable`): it would run as root; the fix."""
    return (
        f"{command}: its executable {problem}, so its agent would run as root; make it "
        "reachable (e.g. a venv outside /root) or show it with tasks.harness.visible_paths"
    )


def reach_refused(
    command: Sequence[str], *, path: str, mounts: Mounts | None, hidden: Iterable[str], key: str
) -> str | None:
    """Why agents of `command` (named by `key`) or their verifiers (this interpreter,
    `sys.executable`) would run as root in `mounts` (`unreachable_executable`), as
    `isolation_refused` takes it; None if neither would."""
    problem = unreachable_executable(command, path, mounts, hidden)
    if problem is not None:
        return unreachable_refused(problem, key)
    why = reach_problem(Path(sys.executable), executable=True, mounts=mounts)
    if why is not None:
        return (
            f"the verifiers' interpreter {sys.executable} cannot be reached by other users "
            f"({why}), so the agent code they import would run as root; make it reachable (e.g. "
            "a venv outside /root) or show it with tasks.harness.visible_paths"
        )
    return None


def check_visible_paths(
    visible_paths: Iterable[str | os.PathLike[str]], *, root: Path, run_dir: Path | None
) -> None:
    """Raise `ConfigError` naming `tasks.harness.visible_paths` when one, as given or resolved,
    lies in what agents never see (shown, it would win): `run_dir`, the workspace `root`, the
    suites' generator."""
    mine = [f(d) for d in (run_dir, root) if d for f in (os.path.abspath, os.path.realpath)]
    for path, folder in itertools.product(visible_paths, [*mine, *generator_files(GYRE_DIR)]):
        if any(under(p, folder) for p in (os.path.abspath(path), os.path.realpath(path))):
            raise ConfigError(
                f"tasks.harness.visible_paths: {str(path)!r} is in {folder} (the run folder, the "
                "workspace root or the suites' generator), which agents never see"
            )


def agent_namespace(
    root: Path,
    *,
    hidden_paths: Iterable[str | os.PathLike[str]],
    visible_paths: Sequence[str | os.PathLike[str]],
    run_dir: Path | None,
) -> tuple[Mounts | None, set[str], str | None]:
    """The namespace every agent of a harness starts from: `(mounts, hidden, None)`, where `hidden`
    is what is hidden on purpose (`hidden_paths`, the workspace `root`, `run_dir`, all absolute,
    and the suites' generator); or `(None, set(), problem)` when no private mount namespace can be
    built here. The closed parents of `root` and of what is exposed are passed through. Raises
    `check_visible_paths`' `ConfigError`.

    With `isolate_mounts` (and CAP_SYS_ADMIN) each agent also starts in a private mount namespace
    (`gyre.sandbox.Mounts`) that denies by default: every top-level folder but the system's
    (`SYSTEM_DIRS`: /usr, /etc, /var, ...) is covered by an empty read-only tmpfs (so /root, /home,
    the checkout with its .git, other runs), as are `hidden_paths`, the run folder, the workspace
    root, the suites' generator and the `tests/` and `solution/` of every task of the configured
    suites; /tmp, /var/tmp, /dev/shm and /run are fresh and private. Bound back read-only at their
    real paths: the interpreter's installation, the gyre package, `visible_paths`, and the files the
    agent command names (its executable and absolute-path arguments); writable: its own execution
    folder. So a venv whose Python lives under a private /root still runs agents as their uid. After
    the agent's tree is gone its files are handed back to root, and the verifier runs on a copy (its
    workspace code as the same uid, its tests as `gyre.tasks.scorer.JUDGE_USER`), in a namespace
    where the whole filesystem is read-only except that copy (and fresh /tmp, /var/tmp, /dev/shm and
    /run that die with it), with no network at all."""
    check_visible_paths(visible_paths, root=root, run_dir=run_dir)
    hide = {os.path.abspath(p) for p in hidden_paths}
    for folder in (root, *(() if run_dir is None else (run_dir,))):
        hide.update((os.path.abspath(folder), os.path.realpath(folder)))
    problem = mount_namespace_problem()
    if problem is not None:
        return (
            None,
            set(),
            (
                f"isolate_mounts: no private mount namespace for agents ({problem}): "
                "an agent sees the node's files as its uid may"
            ),
        )
    hide |= generator_files(GYRE_DIR)
    expose = {os.path.abspath(p) for p in (sys.prefix, sys.base_prefix, GYRE_DIR, *visible_paths)}
    expose |= {os.path.realpath(p) for p in expose}
    traverse = closed_parents(expose | {os.path.abspath(root), os.path.realpath(root)}) - hide
    mounts = Mounts(
        hide=tuple(sorted(hide | covered_top_level())),
        private=PRIVATE_DIRS,
        traverse=tuple(sorted(traverse)),
        expose=tuple(sorted(expose)),
    )
    return mounts, hide, None


def agent_uid_problem(base: int, count: int) -> str | None:
    """Why this node, root, cannot run agents as uids `base`..`base + count - 1` or their
    verifiers' judge as `JUDGE_USER` (`uid_switch_problem`), naming the keys; None if it can."""
    judge = range(JUDGE_USER[0], JUDGE_USER[0] + 1)
    problem = uid_switch_problem((range(base, base + count), judge))
    if problem is None:
        return None
    return (
        f"the node cannot run agents as uids {base}-{base + count - 1} (tasks.harness."
        f"agent_uid_base, agent_uid_count) and their verifiers' judge as uid {judge.start}: "
        f"{problem}"
    )


def workspace_problem(root: Path, mounts: Mounts | None, agent_uids: range) -> str | None:
    """Why agents cannot run as their own uids (`agent_uids`) with their execution folders under
    `root` (an existing folder; each is bound back writable in `mounts`' namespace): the node is
    not root, cannot switch to those uids (`agent_uid_problem`), or other users cannot reach such
    a folder. None: they can."""
    if os.geteuid() != 0:
        return (
            f"isolate_uid: the node runs as uid {os.geteuid()}, not root: agents run as "
            "this user and can read other workspaces and hidden tests"
        )
    problem = agent_uid_problem(agent_uids.start, len(agent_uids))
    if problem is not None:
        return f"isolate_uid: agents run as the node's user: {problem}"
    probe = root / "execution"
    view = mounts and msgspec.structs.replace(
        mounts, writable=(*mounts.writable, os.path.abspath(probe))
    )
    closed = closed_to_others(probe, executable=False, mounts=view)
    if closed is not None:
        mode = stat.S_IMODE(os.stat(closed).st_mode)
        return (
            f"isolate_uid: agents run as root: workspace_root {root} cannot be reached by "
            f"other users ({closed} has mode {mode:o}); choose one whose parents are "
            "world-searchable (o+x)"
        )
    return None


def isolation_refused(problem: str) -> ConfigError:
    """The `ConfigError` of `require_isolation` for `problem` (why an isolation cannot be had):
    it names the key and how to opt out."""
    return ConfigError(
        f"tasks.harness.require_isolation: {problem}; set tasks.harness.require_isolation = "
        "false to run agents unisolated"
    )


def check_isolation(config: HarnessConfig, *, run_dir: Path) -> None:
    """Preflight of `require_isolation` (true by default): raise `isolation_refused`'s `ConfigError`
    when the node is not root (user namespaces give agents no uid or mount namespace of their own),
    cannot run agents as `agent_uid_base`.. (`agent_uid_problem`), cannot build a private mount or
    network namespace, or when the executable of `config.agent_command` (a leading `python` already
    this interpreter; empty: the reference agent's, this interpreter) or the verifiers' interpreter
    cannot be reached by other users in the agents' namespace (`reach_refused`: they would run as
    root), with the run's `run_dir` (absolute) and workspace root hidden as the harness hides them.
    The harness also refuses a workspace root other users cannot reach, when it is built. Whether or
    not isolation is required, `check_visible_paths` first.

    `require_isolation` (true by default) refuses, with one `ConfigError` naming the key and the
    opt-out (`isolation_refused`), a node that is not root (user namespaces map only the node's
    user: no agent gets a uid or a mount namespace of its own, so they cannot give the same
    guarantee), one that is root but cannot switch to agent uids (`agent_uid_problem`: `unshare -r`,
    no CAP_SETUID), one without a mount or network namespace, an `isolate_*` switched off, and a
    workspace root other users cannot reach: the run's preflight (`check_isolation`) before anything
    starts, the harness when it is built. Both also refuse an agent command whose executable agent
    uids cannot reach (`unreachable_executable`: mode bits, as the namespace shows the tree, with
    what the command names bound back unless hidden on purpose), and a verifiers' interpreter they
    cannot reach: such an agent, or the agent code its verifier imports, would run as root
    (`reach_refused`). A command given to one execution (`Harness.run(agent_command=...)`; tasks
    bring none) is checked when it starts: unreachable, that execution is `failed` with the path in
    its reason, and nothing of it runs. With `require_isolation = false` agents then run as the
    node's user, a warning saying why, once; so do agents without a network namespace (they reach
    every port of the node); and an agent whose executable other users cannot reach runs as root,
    with a warning."""
    root = Path(config.workspace_root) if config.workspace_root else run_dir / "executions"
    check_visible_paths(config.visible_paths, root=root, run_dir=run_dir)
    if not config.require_isolation:
        return
    if os.geteuid() != 0:
        raise isolation_refused(
            f"the node runs as uid {os.geteuid()}, not root, so agents cannot run as their own "
            "uids in a mount namespace of their own"
        )
    problem = agent_uid_problem(config.agent_uid_base, config.agent_uid_count)
    if problem is not None:
        raise isolation_refused(problem)
    problem = mount_namespace_problem()
    if problem is not None:
        raise isolation_refused(f"no private mount namespace for agents ({problem})")
    problem = network_namespace_problem()
    if problem is not None:
        raise isolation_refused(
            f"no network namespace for agents ({problem}): they would reach every port of the node"
        )
    mounts, hidden, _ = agent_namespace(
        root, hidden_paths=config.hidden_paths, visible_paths=config.visible_paths, run_dir=run_dir
    )
    command = config.agent_command or (sys.executable,)  # the reference agent's (REACT_AGENT)
    problem = reach_refused(
        command,
        path=config.env.get("PATH", os.environ.get("PATH", os.defpath)),
        mounts=mounts,
        hidden=hidden,
        key="tasks.harness.agent_command",
    )
    if problem is not None:
        raise isolation_refused(problem)


def sealed_endpoint(base_url: str) -> tuple[Relay, str]:
    """The `Relay` that seals an agent whose proxy is at `base_url`, and the URL the agent is given
    as `OPENAI_BASE_URL`: `base_url` itself when its host is a loopback IP or `localhost` (the same
    port is bound on that address, 127.0.0.1 for `localhost`, inside the agent's namespace), else
    the same URL with host 127.0.0.1 there. The relay connects to the proxy's host and port from
    the node's namespace (0.0.0.0 and :: as loopback). Raises `ValueError` for a URL that is not
    http(s) with a host.

    Network (`isolate_network`): each agent starts in a network namespace of its own where only
    loopback is up and one port listens: the proxy's, at the address of `OPENAI_BASE_URL` (unchanged
    for a loopback URL, so any HTTP client works as before). Its supervisor, still in the node's
    namespace, relays each connection to the proxy (`gyre.sandbox.Relay`). The node's cells, gloo
    TCPStore and every other port, its abstract unix sockets and the outside world are out of reach;
    its unix sockets bound at a path (`node_sockets`, as found when the agent starts) are covered by
    /dev/null in the agent's and its verifier's mount namespaces, and /run, where services keep
    theirs, is a fresh tmpfs there. An agent that runs as root could leave the namespace: only with
    `require_isolation = false` does one (below). Without root the network namespace is owned by a
    user namespace of the agent's own that maps only the node's user, to itself (no capability
    survives the agent's exec): the same reach over the network, but the node's unix sockets at a
    path stay as reachable as its files (no mount namespace)."""
    parts = urllib.parse.urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"base_url={base_url!r} must be an http(s) URL with a host")
    host = parts.hostname
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if host == "localhost" or (ip is not None and ip.is_loopback):
        inside, url = ("127.0.0.1" if ip is None else host), base_url
    else:
        inside = "127.0.0.1"
        url = urllib.parse.urlunsplit(parts._replace(netloc=f"{inside}:{port}"))
    target = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return Relay(listen=((inside, port),), target=(target, port)), url


def node_sockets() -> set[str]:
    """Unix sockets bound at a path in the node's network namespace (`/proc/net/unix`) that
    exist now: an agent's namespace covers each with /dev/null (its own network namespace already
    keeps it from the abstract ones). Sockets under /tmp are out of sight anyway."""
    with open("/proc/net/unix", encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()[1:]
    paths = {fields[7] for line in lines if len(fields := line.split(maxsplit=7)) == 8}
    return {
        p
        for p in paths
        if os.path.isabs(p)
        and os.path.normpath(p) == p
        and p != "/"
        and os.path.exists(p)
        and not os.path.isdir(p)
    }


def tighten_hidden(task: Task) -> None:
    """Make `tests/` and `solution/` of `task` 0700 (owner only): no agent uid can enter them.

    The verifier and the oracle run as root and are unaffected; git does not track folder modes.
    """
    for folder in (task.tests_dir, task.solution_dir):
        if folder.is_dir() and stat.S_IMODE(os.stat(folder).st_mode) & 0o077:
            os.chmod(folder, 0o700)
            logger.debug("isolation: %s is now 0700 (hidden from agent uids)", folder)
