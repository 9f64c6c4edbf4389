"""Agents and verifiers in a private mount namespace (root with CAP_SYS_ADMIN, as on this machine
and CI): the venv's Python under a private /root still runs them as their own uid, and they reach
neither hidden tests, other workspaces, the run folder nor /root; a verifier writes only its
copy."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import pytest

from gyre.agents.harness import Harness
from gyre.agents.isolation import check_isolation, closed_parents
from gyre.config import HarnessConfig
from gyre.errors import ConfigError
from gyre.sandbox import Limits, Mounts, mount_namespace_problem, run_supervised
from gyre.tasks.scorer import verify
from gyre.tasks.task import load_task
from tests.agents.drive import run_policy
from tests.tasks.test_task import make_task

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        os.geteuid() != 0 or mount_namespace_problem() is not None,
        reason=f"needs root with CAP_SYS_ADMIN: {mount_namespace_problem()}",
    ),
]

UID_BASE = 310_000

ROOT_FILE = next((p for p in ("/root/.profile", "/root/.bashrc") if os.path.isfile(p)), None)

TESTS = {"test_out.py": "def test_out():\n    assert open('out.txt').read() == 'mine'\n"}

# Run by the venv's own interpreter (which lives under /root here): tries every forbidden path.
PROBE = """
import json, os, sys
def attempt(path):
    try:
        open(path).read()
        return "read"
    except Exception as exc:
        return type(exc).__name__
import gyre  # the package is bound back for the reference agent
result = {"uid": os.getuid(), "python": sys.base_prefix, "gyre": gyre.__file__,
          "tests": attempt(sys.argv[1]), "solution": attempt(sys.argv[2]),
          "sibling_tests": attempt(sys.argv[3]), "other": attempt(sys.argv[4]),
          "call_log": attempt(sys.argv[5]), "root": attempt(sys.argv[6]), \
"root_list": sorted(os.listdir("/root"))}
open("out.txt", "w").write("mine")
print(json.dumps(result))
"""


@pytest.fixture
def run_dir():
    """A run folder as the loop makes it: under a 0755 parent (this checkout's is root's, 0755)."""
    path = Path(tempfile.mkdtemp(prefix="gyre-mounts-", dir="/tmp"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def config_harness(server, run_dir: Path, **kw) -> Harness:
    config = HarnessConfig(agent_uid_base=UID_BASE, agent_uid_count=64, kill_grace_s=0.5, **kw)
    return Harness.from_config(config, base_url=server.base_url, run_dir=run_dir)


async def test_agent_on_the_venv_python_reaches_only_its_workspace(
    run_dir: Path, server, bridge
) -> None:
    if ROOT_FILE is None:
        pytest.skip("no file in /root to try")
    suite = run_dir / "suite"
    task = load_task(make_task(suite / "t", toml="[agent]\ndeadline_s = 60.0\n", tests=TESTS))
    (task.path / "solution").mkdir()
    (task.path / "solution" / "oracle.json").write_text("{}")
    sibling = load_task(make_task(suite / "u", tests={"test_secret.py": "SECRET = 1\n"}))
    harness = config_harness(server, run_dir)
    assert harness.isolated and harness.mounts is not None
    # another execution's files, and the run's call log, both readable by anyone on the host
    other = harness.execution_dir("other") / "workspace"
    other.mkdir(parents=True)
    (other / "secret.txt").write_text("other")
    (run_dir / "calls.log").write_bytes(b"calls")
    for path in (other / "secret.txt", run_dir / "calls.log", sibling.tests_dir / "test_secret.py"):
        assert os.stat(path).st_mode & stat.S_IROTH
    argv = [
        str(task.tests_dir / "test_out.py"),
        str(task.solution_dir / "oracle.json"),
        str(sibling.tests_dir / "test_secret.py"),
        str(other / "secret.txt"),
        str(run_dir / "calls.log"),
        ROOT_FILE,
    ]
    outcome = await run_policy(
        harness,
        server,
        bridge,
        task,
        "probe",
        lambda call: {"role": "assistant", "content": "ok"},
        agent_command=[
            sys.executable,
            "-c",
            f"import urllib.request, os, json\n{PROBE}" + CALL,
            *argv,
        ],
    )
    assert outcome.termination == "finished", (
        outcome.failure_reason,
        outcome.stdout_tail,
        outcome.stderr_tail,
    )
    result = json.loads(outcome.stdout_tail.splitlines()[0])
    assert UID_BASE <= result["uid"] < UID_BASE + 64  # not root: the venv's Python was reachable
    assert result["python"] == sys.base_prefix and result["gyre"].startswith(
        str(Path(__file__).parents[2])
    )
    for key in ("tests", "solution", "sibling_tests", "other", "call_log", "root"):
        assert result[key] == "FileNotFoundError", key
    assert (
        result["root_list"] == [".pyenv"] if sys.base_prefix.startswith("/root/.pyenv/") else True
    )
    # the agent's own work is scored, by a verifier that also ran as its uid
    assert (outcome.score.passed, outcome.score.total) == (1, 1)
    assert harness.statistics().isolated == 1


# one model call, so the execution counts (a run without one is an infrastructure failure)
CALL = """
body = json.dumps({"model": "gyre", "messages": [{"role": "user", "content": "hi"}]}).encode()
headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], \
"Content-Type": "application/json"}
urllib.request.urlopen(urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", \
body, headers)).read()
"""


# Agent-written code that the hidden test imports: it tries to write outside the verification copy.
ESCAPE = """
import os
def attempt(path):
    try:
        with open(path, "w") as f:
            f.write("escaped")
        return "written"
    except OSError as exc:
        return exc.errno
RESULTS = {name: attempt(path) for name, path in PATHS.items()}
RESULTS["own"] = attempt("own.txt")
RESULTS["uid"] = os.getuid()
"""

ESCAPE_TEST = """
import errno, os
from escape import RESULTS

def test_runs_as_the_agent_uid():
    assert RESULTS["uid"] >= 1000

def test_writes_its_own_copy():
    assert (RESULTS["own"], open("own.txt").read()) == ("written", "escaped")

def test_host_tmp_is_private():
    assert RESULTS["host_tmp"] == "written"  # a fresh tmpfs: the host's /tmp is untouched \
(checked outside)

def test_world_writable_host_folder_is_read_only():
    assert RESULTS["open_folder"] == errno.EROFS

def test_task_and_original_workspace_are_out_of_sight():
    assert (RESULTS["task"], RESULTS["original"]) == (errno.ENOENT, errno.ENOENT)
"""


async def test_verifier_runs_agent_code_unprivileged_and_writes_only_its_copy(
    run_dir: Path,
) -> None:
    # world-writable on the host, in a system folder agents see (/run is private to them)
    shared = Path(tempfile.mkdtemp(prefix="gyre-open-", dir="/var/lib"))
    os.chmod(shared, 0o777)
    marker = f"/tmp/gyre-escape-{secrets.token_hex(4)}"
    try:
        task = load_task(
            make_task(
                run_dir / "suite" / "t",
                toml="[verifier]\nnum_tests = 5\n",
                tests={"test_escape.py": ESCAPE_TEST},
            )
        )
        workspace = run_dir / "ws"
        workspace.mkdir()
        paths = {
            "host_tmp": marker,
            "open_folder": str(shared / "x"),
            "task": str(task.tests_dir / "x"),
            "original": str(workspace / "x"),
        }
        (workspace / "escape.py").write_text(f"PATHS = {paths!r}\n{ESCAPE}")
        expose = tuple(sorted({sys.prefix, sys.base_prefix, os.path.realpath(sys.base_prefix)}))
        mounts = Mounts(
            hide=("/root",),
            private=("/tmp", "/var/tmp", "/dev/shm"),
            expose=expose,
            traverse=tuple(sorted(closed_parents(expose))),  # a checkout under a 0700 folder
            read_only=True,
        )
        score = await verify(
            task,
            workspace,
            user=(UID_BASE + 7, UID_BASE + 7),
            mounts=mounts,
            limits=Limits(max_processes=64),
        )
        assert score.failed_tests == () and (score.passed, score.total) == (5, 5)
        assert not os.path.exists(marker)
        assert os.listdir(shared) == []
        assert not (task.tests_dir / "x").exists() and not (workspace / "x").exists()
        assert sorted(os.listdir(workspace)) == ["escape.py"]
    finally:
        shutil.rmtree(shared, ignore_errors=True)
        if os.path.exists(marker):
            os.unlink(marker)


async def test_a_failed_namespace_is_a_clear_127(run_dir: Path) -> None:
    # bind a folder that cannot be created: the tree under a read-only root has no such parent
    with open(run_dir / "out", "wb") as out:
        result = await run_supervised(
            ["true"],
            cwd="/",
            env={"PATH": os.environ["PATH"]},
            limits=Limits(),
            deadline_s=30,
            stdout=out,
            stderr=out,
            mounts=Mounts(
                read_only=True,
                expose=(str(run_dir),),
                hide=(str(run_dir),),
                writable=("/proc/nonexistent",),
            ),
        )
    assert result.exit_code == 0  # a missing folder is skipped, the rest applies
    with open(run_dir / "out", "wb") as out:
        result = await run_supervised(
            ["sh", "-c", "echo x > /etc/gyre-should-fail"],
            cwd="/",
            env={"PATH": os.environ["PATH"]},
            limits=Limits(),
            deadline_s=30,
            stdout=out,
            stderr=out,
            mounts=Mounts(read_only=True),
        )
    assert result.exit_code != 0 and "Read-only file system" in (run_dir / "out").read_text()
    assert not os.path.exists("/etc/gyre-should-fail")


def test_mounts_and_hidden_paths_are_validated() -> None:
    with pytest.raises(ValueError, match="normalised absolute"):
        Mounts(hide=("tmp",))
    with pytest.raises(ValueError, match="normalised absolute"):
        Mounts(expose=("/a/../b",))
    with pytest.raises(ValueError, match="must be absolute"):
        HarnessConfig(hidden_paths=("root",))
    with pytest.raises(ValueError, match="must be absolute"):
        Harness(base_url="http://127.0.0.1:1/v1", hidden_paths=("root",))


async def test_visible_paths_cannot_show_the_run_folder(run_dir: Path, server) -> None:
    """A shown path wins over a hidden one, so `visible_paths` in the run folder (the call log:
    every execution's tokens; checkpoints) or the workspace root handed it to every agent (found
    by a tester: an agent read calls.log). Refused, naming the key, when the harness is built and
    in the run's preflight, isolation required or not; a folder beside them is shown."""
    (run_dir / "calls.log").write_text("every execution's tokens")
    for shown in (run_dir, run_dir / "calls.log", run_dir / "executions" / "x"):
        with pytest.raises(ConfigError) as refused:
            config_harness(server, run_dir, visible_paths=(str(shown),))
        assert str(refused.value) == (
            f"tasks.harness.visible_paths: '{shown}' is in {run_dir} (the run folder, the "
            "workspace root or the suites' generator), which agents never see"
        )
    for required in (True, False):
        config = HarnessConfig(visible_paths=(str(run_dir),), require_isolation=required)
        with pytest.raises(ConfigError, match="visible_paths: '.*' is in .*, which agents never"):
            check_isolation(config, run_dir=run_dir)
    beside = Path(tempfile.mkdtemp(prefix="gyre-beside-", dir="/tmp"))
    os.chmod(beside, 0o755)
    (beside / "data.txt").write_text("shown")
    try:
        task = load_task(make_task(run_dir / "suite" / "t", tests=TESTS))
        harness = config_harness(server, run_dir, visible_paths=(str(beside),))
        script = f"cat {beside / 'data.txt'} {run_dir / 'calls.log'}"
        ran = await harness.run(task, "e", agent_command=["/bin/sh", "-c", script])
    finally:
        shutil.rmtree(beside)
    assert "shown" in ran.stdout_tail and "tokens" not in ran.stdout_tail
    assert f"{run_dir / 'calls.log'}: No such file or directory" in ran.stderr_tail


TRAVERSE_PROBE = r"""
import json, os, sys
def attempt(action):
    try:
        action()
        return "ok"
    except OSError as exc:
        return type(exc).__name__
closed = sys.argv[1]
print(json.dumps({
    "shared": attempt(lambda: open(f"{closed}/shared/file").read()),
    "secret": attempt(lambda: open(f"{closed}/secret").read()),
    "link": attempt(lambda: open(f"{closed}/link").read()),
    "list": attempt(lambda: os.listdir(closed)),
    "write": attempt(lambda: open(f"{closed}/shared/open/new", "w").write("x")),
}))
"""


@pytest.mark.parametrize("read_only", [False, True])
async def test_traverse_passes_a_closed_folder_as_if_it_had_o_x(
    run_dir: Path, read_only: bool
) -> None:
    """A 0700 folder (a mktemp -d checkout) in `traverse`: the agent uid reads what lies below by
    its own modes, lists nothing there, and with `read_only` writes nowhere below it."""
    closed = Path(tempfile.mkdtemp(prefix="gyre-closed-", dir="/tmp"))  # 0700, root's
    try:
        (closed / "shared" / "open").mkdir(parents=True)
        (closed / "shared" / "file").write_text("public")
        os.chmod(closed / "shared" / "open", 0o777)
        (closed / "secret").write_text("private")
        os.chmod(closed / "secret", 0o600)
        (closed / "link").symlink_to("shared/file")
        probe = ["/usr/bin/env", "python3", "-I", "-c", TRAVERSE_PROBE, str(closed)]
        reports = []
        for mounts in (None, Mounts(traverse=(str(closed),), read_only=read_only)):
            with open(run_dir / "out", "wb") as out:
                result = await run_supervised(
                    probe,
                    cwd="/",
                    env={"PATH": "/usr/bin:/bin"},
                    limits=Limits(),
                    deadline_s=30,
                    stdout=out,
                    stderr=out,
                    user=(UID_BASE + 60, UID_BASE + 60),
                    mounts=mounts,
                )
            assert result.exit_code == 0, (run_dir / "out").read_text()
            reports.append(json.loads((run_dir / "out").read_text()))
        unchanged = dict.fromkeys(("shared", "secret", "link", "list", "write"), "PermissionError")
        assert reports[0] == unchanged  # without the namespace nothing below is reached
        assert reports[1] == {
            "shared": "ok",
            "secret": "PermissionError",
            "link": "ok",
            "list": "PermissionError",
            "write": "OSError" if read_only else "ok",
        }
        assert stat.S_IMODE(os.stat(closed).st_mode) == 0o700  # the host folder itself is untouched
        assert (closed / "shared" / "open" / "new").exists() is not read_only  # the write landed
    finally:
        shutil.rmtree(closed)


async def test_configured_suites_are_hidden_before_their_first_task(run_dir: Path, server) -> None:
    """A suite none of whose tasks has run yet, in a folder agents are shown (`visible_paths`),
    is readable by default modes (0644 under 0755); `hide_suite` (the job calls it for every
    configured suite) covers it."""
    suites = Path(
        tempfile.mkdtemp(prefix="gyre-suites-", dir="/tmp")
    )  # not under the hidden run folder
    os.chmod(suites, 0o755)
    try:
        task = load_task(make_task(suites / "a" / "t", tests=TESTS))
        other = load_task(make_task(suites / "b" / "u", tests={"test_secret.py": "SECRET = 1\n"}))
        script = f"cat {other.tests_dir / 'test_secret.py'} || echo unreadable"
        harness = config_harness(server, run_dir, visible_paths=(str(suites),))
        before = await harness.run(task, "before", agent_command=["/bin/sh", "-c", script])
        harness.hide_suite(suites / "b")
        after = await harness.run(task, "after", agent_command=["/bin/sh", "-c", script])
    finally:
        shutil.rmtree(suites)
    assert "SECRET = 1" in before.stdout_tail  # the control: the file is there to be read
    assert "SECRET" not in after.stdout_tail and "No such file or directory" in after.stderr_tail


async def test_the_checkout_and_the_hosts_tmp_are_out_of_sight(run_dir: Path, server) -> None:
    """Default deny: the checkout (its .git holds every shipped suite's tests), other top-level
    folders and the host's /tmp are not there; the gyre package and the venv are."""
    import gyre

    repo = Path(gyre.__file__).resolve().parents[1]
    marker = Path(tempfile.mkdtemp(prefix="gyre-host-tmp-", dir="/tmp"))
    os.chmod(marker, 0o755)
    task = load_task(make_task(run_dir / "suite" / "t", tests=TESTS))
    harness = config_harness(server, run_dir)
    paths = [
        repo / ".git" / "HEAD",
        repo / "pyproject.toml",
        marker,
        Path(gyre.__file__),
        Path(sys.prefix) / "pyvenv.cfg",
    ]
    script = (
        "for p in " + " ".join(map(str, paths)) + "; do test -e $p && echo yes || echo no; done; "
    )
    # the suites' generator is an empty folder (it would regenerate their hidden tests); the agents'
    # own imports still work
    generator = Path(gyre.__file__).parent / "tasks" / "suites"
    script += (
        f"ls -A {generator} | wc -l; "
        f"{sys.executable} -c 'import gyre.agents.react' && echo agent-ok; "
        f"{sys.executable} -c 'from gyre.tasks.suites import generate_suite' 2>/dev/null "
        "|| echo no-generator"
    )
    try:
        outcome = await harness.run(task, "look", agent_command=["/bin/sh", "-c", script])
    finally:
        shutil.rmtree(marker)
    assert outcome.stdout_tail.split() == [
        "no",
        "no",
        "no",
        "yes",
        "yes",
        "0",
        "agent-ok",
        "no-generator",
    ], outcome.stderr_tail
    assert (generator / "__init__.py").stat().st_size > 0  # the node's copy is untouched


async def test_without_network_a_command_reaches_nothing_on_loopback(run_dir: Path) -> None:
    """`Mounts(network=False)` (verifiers): a listener on the host's 127.0.0.1 is unreachable."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        script = (
            f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=5)\n"
            "    print('connected')\nexcept OSError as exc:\n    print('refused', exc.errno)"
        )
        seen = []
        for network in (True, False):
            with open(run_dir / "out", "wb") as out:
                result = await run_supervised(
                    ["/usr/bin/env", "python3", "-I", "-c", script],
                    cwd="/",
                    env={"PATH": "/usr/bin:/bin"},
                    limits=Limits(),
                    deadline_s=30,
                    stdout=out,
                    stderr=out,
                    user=(UID_BASE + 61, UID_BASE + 61),
                    mounts=Mounts(network=network),
                )
            assert result.exit_code == 0, (run_dir / "out").read_text()
            seen.append((run_dir / "out").read_text().split()[0])
    assert seen == ["connected", "refused"]
