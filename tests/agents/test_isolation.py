"""Agent isolation as root: each agent runs as its own uid, away from hidden tests and other
workspaces."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import anyio
import msgspec
import pytest

from gyre.agents.control import ExecutionControl, mint_api_key
from gyre.agents.harness import REACT_AGENT, Harness
from gyre.sandbox import Limits, mount_namespace_problem, run_supervised
from gyre.tasks.task import load_task
from tests.agents.drive import run_policy, script_policy
from tests.agents.openai_server import tool_call_message
from tests.sandbox.test_supervised import alive
from tests.tasks.test_task import make_task

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(os.geteuid() != 0, reason="agent uids need the node to run as root"),
]

PYTHON = "/usr/bin/python3"
"""An interpreter every user can run (the venv's may sit under a private home, as here)."""

UID_BASE = 300_000

TESTS = {
    "test_out.py": (
        "def test_out():\n    assert open('out.txt').read() == 'mine'\n\n\n"
        "def test_secret_untouched():\n    assert open('secret.txt').read() == 'x'\n"
    )
}

# Holds its workspace open: writes its uid and pid, then waits to be stopped.
HOLDER = """
import os, time
open("secret.txt", "w").write("%d %d" % (os.getuid(), os.getpid()))
time.sleep(60)
"""

# Tries the hidden test file and the other execution's file; writes its own; makes one model call.
PROBE = """
import json, os, sys, urllib.request
def attempt(path):
    try:
        open(path).read()
        return "read"
    except Exception as exc:
        return type(exc).__name__
result = {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
          "tests": attempt(sys.argv[1]), "other": attempt(sys.argv[2]),
          "solution": attempt(sys.argv[3] + "/oracle.json"), \
"instruction": open(os.environ["GYRE_INSTRUCTION_FILE"]).read()}
open("out.txt", "w").write("mine")
open("secret.txt", "w").write("x")
body = json.dumps({"model": "gyre", "messages": [{"role": "user", "content": "hi"}]}).encode()
headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], \
"Content-Type": "application/json"}
urllib.request.urlopen(urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", \
body, headers)).read()
print(json.dumps(result))
"""


@pytest.fixture
def open_dir():
    """A folder every user can traverse, like a checkout (pytest's tmp_path is root's own)."""
    if not os.access(PYTHON, os.X_OK):
        pytest.skip(f"{PYTHON} is missing")
    path = Path(tempfile.mkdtemp(prefix="gyre-isolation-", dir="/tmp"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("mounts", [True, False], ids=["mount-namespace", "uid-only"])
async def test_agent_cannot_read_hidden_tests_or_other_workspaces(
    open_dir: Path, server, bridge, mounts: bool
) -> None:
    if mounts and mount_namespace_problem() is not None:
        pytest.skip(f"no mount namespace here: {mount_namespace_problem()}")
    task = load_task(
        make_task(open_dir / "suite" / "t", toml="[agent]\ndeadline_s = 30.0\n", tests=TESTS)
    )
    (task.path / "solution").mkdir()
    (task.path / "solution" / "oracle.json").write_text("{}")
    hidden = task.tests_dir / "test_out.py"
    assert (
        stat.S_IMODE(os.stat(task.tests_dir).st_mode) == 0o755
    )  # world-readable, as in a checkout
    harness = agent_harness(
        server,
        open_dir,
        kill_grace_s=0.5,
        isolate_mounts=mounts,
        require_isolation=mounts,  # uid-only: opted out of the mount namespace
    )
    assert harness.isolated and (harness.mounts is not None) == mounts
    holder_secret = harness.execution_dir("holder") / "workspace" / "secret.txt"
    holder_control = ExecutionControl()

    async def run_holder() -> None:
        nonlocal holder
        holder = await harness.run(
            task, "holder", agent_command=[PYTHON, "-I", "-c", HOLDER], control=holder_control
        )

    holder = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(run_holder)
        with anyio.fail_after(20):
            while not (holder_secret.exists() and holder_secret.read_text()):
                await anyio.sleep(0.05)
        holder_uid, holder_pid = map(int, holder_secret.read_text().split())
        probe = await run_policy(
            harness,
            server,
            bridge,
            task,
            "probe",
            lambda call: {"role": "assistant", "content": "ok"},
            agent_command=[
                PYTHON,
                "-I",
                "-c",
                PROBE,
                str(hidden),
                str(holder_secret),
                str(task.solution_dir),
            ],
        )
        assert alive(holder_pid)  # the holder ran all along
        holder_control.stop("timeout")
    result = json.loads(probe.stdout_tail)
    # covered by the namespace: gone; by modes alone: refused
    refused = "FileNotFoundError" if mounts else "PermissionError"
    assert (result["tests"], result["other"], result["solution"]) == (refused,) * 3
    assert result["instruction"] == task.instruction
    assert UID_BASE <= result["uid"] < UID_BASE + 64 and UID_BASE <= holder_uid < UID_BASE + 64
    assert result["uid"] != holder_uid
    assert (result["gid"], result["groups"]) == (result["uid"], [])
    # what the agent wrote, as its own uid, is scored; the model call went through over loopback
    assert probe.termination == "finished" and probe.model_calls == 1
    assert (probe.score.passed, probe.score.total) == (2, 2)
    # the holder, running as another uid, was killed from outside (root signals it)
    assert holder.termination == "failed" and "before its first model call" in holder.failure_reason
    assert not alive(holder_pid)
    assert stat.S_IMODE(os.stat(task.tests_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(task.solution_dir).st_mode) == 0o700
    assert harness.statistics().isolated == 2


async def test_kept_workspace_is_handed_back_to_root(open_dir: Path, server) -> None:
    task = load_task(
        make_task(open_dir / "suite" / "t", toml="[agent]\ndeadline_s = 30.0\n", tests=TESTS)
    )
    harness = agent_harness(server, open_dir, keep_workspaces=True)
    key = mint_api_key("kept")
    control = ExecutionControl(
        refresh=lambda c: c.observe_totals(model_calls=1, completion_tokens=1)
    )
    script = "import os; open('out.txt', 'w').write('mine'); print(os.getuid())"
    outcome = await harness.run(
        task, "kept", agent_command=[PYTHON, "-I", "-c", script], api_key=key, control=control
    )
    assert int(outcome.stdout_tail) >= UID_BASE
    exec_dir = harness.execution_dir("kept")
    assert stat.S_IMODE(os.stat(harness.workspace_root).st_mode) == 0o711
    assert stat.S_IMODE(os.stat(exec_dir).st_mode) == 0o711
    for name in ("stdout.log", "stderr.log"):
        assert stat.S_IMODE(os.stat(exec_dir / name).st_mode) == 0o600
    owners = {
        os.lstat(os.path.join(d, n)).st_uid for d, ds, fs in os.walk(exec_dir) for n in ds + fs
    }
    assert owners == {0}  # no file of the execution keeps the (reusable) agent uid


async def test_unreachable_workspace_root_runs_agents_as_root_with_a_warning(
    tmp_path: Path, server, caplog: pytest.LogCaptureFixture
) -> None:
    # pytest's tmp_path lies under a 0700 folder of root: no other user can reach a workspace there
    # (without the mount namespace: with it, /tmp is the agent's own and the folder is bound back)
    with caplog.at_level(logging.WARNING, logger="gyre.agents.isolation"):
        harness = Harness(
            base_url=server.base_url,
            workspace_root=tmp_path / "executions",
            isolate_mounts=False,
            require_isolation=False,
        )
    assert not harness.isolated
    assert stat.S_IMODE(os.stat(harness.workspace_root).st_mode) == 0o700
    assert any("cannot be reached by other users" in r.getMessage() for r in caplog.records)


def test_uid_range_is_validated() -> None:
    with pytest.raises(ValueError, match="agent_uid_base=0"):
        Harness(base_url="http://127.0.0.1:1/v1", agent_uid_base=0)


async def test_process_limit_binds_an_agent_uid(open_dir: Path) -> None:
    # root is exempt from RLIMIT_NPROC; the agent's own uid is not
    script = (
        "import subprocess\nn = 0\ntry:\n    for _ in range(200):\n"
        "        subprocess.Popen(['sleep', '60']); n += 1\nexcept OSError:\n    pass\nprint(n)\n"
    )
    with open(open_dir / "out", "wb") as out:
        result = await run_supervised(
            [PYTHON, "-I", "-c", script],
            cwd=open_dir,
            env={"PATH": os.environ["PATH"]},
            limits=Limits(max_processes=20),
            deadline_s=60,
            stdout=out,
            stderr=out,
            user=(UID_BASE + 999, UID_BASE + 999),
        )
    assert result.ended == "exited"
    assert 0 < int((open_dir / "out").read_text()) < 20


def agent_harness(server, open_dir: Path, **options) -> Harness:
    """A harness for `server` with its workspaces under `open_dir` and 64 agent uids from
    `UID_BASE`; `options` are `Harness`'s others."""
    return Harness(
        base_url=server.base_url,
        workspace_root=open_dir / "executions",
        agent_uid_base=UID_BASE,
        agent_uid_count=64,
        **options,
    )


def closed_to_others(path: Path) -> Path | None:
    """The first folder on the way to `path` that other users cannot traverse, or None."""
    for p in (path.absolute(), path.resolve()):
        for folder in p.parents:
            if not os.stat(folder).st_mode & stat.S_IXOTH:
                return folder
    return None


async def test_reference_agent_runs_as_its_own_uid(open_dir: Path, server, bridge) -> None:
    import gyre

    mounts = mount_namespace_problem() is None  # the namespace binds the interpreter back
    for needed in (Path(sys.executable), Path(gyre.__file__)):
        closed = closed_to_others(needed)
        if (
            closed is not None and not mounts
        ):  # e.g. a venv under /root (0700): the harness warns and runs as root
            pytest.skip(
                f"{needed} is not reachable by other users ({closed} has mode "
                f"{stat.S_IMODE(os.stat(closed).st_mode):o})"
            )
    task = load_task(
        make_task(open_dir / "suite" / "t", toml="[agent]\ndeadline_s = 60.0\n", tests=TESTS)
    )
    harness = agent_harness(server, open_dir)
    script = [
        tool_call_message("write_file", {"path": "out.txt", "content": "mine"}, "c0"),
        tool_call_message("write_file", {"path": "secret.txt", "content": "x"}, "c1"),
        tool_call_message("run", {"command": f"id -u; cat {task.tests_dir / 'test_out.py'}"}, "c2"),
        tool_call_message("finish", {}, "c3"),
    ]
    seen: list[dict] = []
    outcome = await run_policy(harness, server, bridge, task, "react", script_policy(script, seen))
    assert REACT_AGENT[0] == sys.executable
    assert outcome.termination == "finished", outcome.stderr_tail
    assert outcome.score.score == 1.0 and harness.statistics().isolated == 1
    ran = next(m["content"] for m in seen if m["role"] == "tool" and "exit code" in m["content"])
    assert (
        "No such file or directory" if mounts else "Permission denied"
    ) in ran and "def test_out" not in ran
    assert int(ran.split("\n")[1]) >= UID_BASE


def test_require_isolation_refuses_instead_of_warning(open_dir, monkeypatch, caplog):
    """`tasks.harness.require_isolation`, true by default: each way isolation can be missing is
    one ConfigError naming the key and the opt-out, from the preflight and from the harness;
    with `require_isolation = false` the harness warns and runs agents with less isolation."""
    import gyre.agents.isolation as isolation
    from gyre.config import HarnessConfig, config_from_dict
    from gyre.errors import ConfigError

    opt_out = r"; set tasks\.harness\.require_isolation = false to run agents unisolated$"
    for harness in (
        {"isolate_mounts": False},
        {"require_isolation": True, "isolate_mounts": False},
    ):
        with pytest.raises(
            ConfigError, match=r"isolate_mounts=false needs require_isolation=false too"
        ):
            config_from_dict({"tasks": {"harness": harness}})
    required, url = HarnessConfig(), "http://127.0.0.1:9/v1"
    relaxed_config = HarnessConfig(require_isolation=False)
    assert required.require_isolation and required == HarnessConfig(require_isolation=True)
    # not required: never refuses
    isolation.check_isolation(relaxed_config, run_dir=open_dir / "run")
    if (
        mount_namespace_problem() is None
    ):  # root with a mount namespace (here and in CI): nothing to refuse
        isolation.check_isolation(required, run_dir=open_dir / "run")
        built = Harness.from_config(required, base_url=url, run_dir=open_dir / "ok")
        assert built.isolated and built.mounts is not None

    monkeypatch.setattr(isolation, "mount_namespace_problem", lambda: "no CAP_SYS_ADMIN")
    with pytest.raises(
        ConfigError,
        match=r"^tasks\.harness\.require_isolation: no private mount namespace for agents "
        r"\(no CAP_SYS_ADMIN\)" + opt_out,
    ):
        isolation.check_isolation(required, run_dir=open_dir / "run")
    with pytest.raises(
        ConfigError,
        match=r"require_isolation: isolate_mounts: no private mount namespace .*CAP_SYS_ADMIN.*"
        + opt_out,
    ):
        Harness.from_config(required, base_url=url, run_dir=open_dir / "mounts")
    with pytest.raises(ConfigError, match=r"require_isolation: isolate_mounts is false" + opt_out):
        Harness(base_url=url, workspace_root=open_dir / "direct", isolate_mounts=False)
    with caplog.at_level(logging.WARNING, logger="gyre.agents.isolation"):
        relaxed = Harness.from_config(relaxed_config, base_url=url, run_dir=open_dir / "relaxed")
    assert relaxed.mounts is None and relaxed.isolated  # own uid, but the node's view of its files

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(
        ConfigError,
        match=r"^tasks\.harness\.require_isolation: the node runs as uid 1000, not root, so "
        r"agents cannot run as their own uids in a mount namespace of their own" + opt_out,
    ):
        isolation.check_isolation(required, run_dir=open_dir / "run")
    with pytest.raises(
        ConfigError,
        match=r"require_isolation: isolate_uid: the node runs as uid 1000, not root.*" + opt_out,
    ):
        Harness.from_config(required, base_url=url, run_dir=open_dir / "uid")


def test_require_isolation_refuses_without_a_network_namespace(open_dir, monkeypatch, caplog):
    """`isolate_network` missing is one ConfigError naming the key under `require_isolation`
    (preflight and harness), a warning otherwise; agents then get the proxy's URL as it is."""
    import gyre.agents.harness as harness_module
    import gyre.agents.isolation as isolation
    from gyre.config import HarnessConfig
    from gyre.errors import ConfigError

    url = "http://0.0.0.0:9/v1"
    if mount_namespace_problem() is None:
        sealed = Harness.from_config(HarnessConfig(), base_url=url, run_dir=open_dir / "sealed")
        assert sealed.sealed and sealed.agent_base_url == "http://127.0.0.1:9/v1"
        assert sealed.relay.target == ("127.0.0.1", 9)
    for module in (isolation, harness_module):
        monkeypatch.setattr(module, "mount_namespace_problem", lambda: None, raising=False)
        monkeypatch.setattr(module, "network_namespace_problem", lambda: "no CAP_SYS_ADMIN")
    with pytest.raises(
        ConfigError,
        match=r"require_isolation: no network namespace for agents "
        r"\(no CAP_SYS_ADMIN\): they would reach every port",
    ):
        isolation.check_isolation(HarnessConfig(), run_dir=open_dir / "run")
    with pytest.raises(
        ConfigError,
        match=r"require_isolation: isolate_network: no network "
        r"namespace for agents \(no CAP_SYS_ADMIN\)",
    ):
        Harness.from_config(HarnessConfig(), base_url=url, run_dir=open_dir / "net")
    isolation._warned.discard("network")
    with caplog.at_level(logging.WARNING, logger="gyre.agents.isolation"):
        relaxed = Harness.from_config(
            HarnessConfig(require_isolation=False), base_url=url, run_dir=open_dir / "relaxed"
        )
    assert not relaxed.sealed and "they reach every port of the node" in caplog.text
    assert (relaxed.relay, relaxed.agent_base_url) == (None, url)  # the proxy's URL as it is
    off = Harness(
        base_url=url,
        workspace_root=open_dir / "off",
        isolate_network=False,
        require_isolation=False,
    )
    assert not off.sealed and off.statistics().sealed == 0


async def test_the_main_jobs_agent_starts_sealed(tmp_path: Path, server, bridge) -> None:
    """`examples/cpu.toml` (`make run`) keeps `require_isolation` at its default: as root its
    preflight passes, and its harness, built as the job builds it, runs the reference agent (its
    own flags) on a `learnable-long` task as its own uid, sealed, relayed to the model server."""
    from gyre.agents.isolation import check_isolation
    from gyre.config import load_config
    from gyre.rollout.harness import with_interpreter
    from gyre.tasks.task import load_suite

    if mount_namespace_problem() is not None:
        pytest.skip(f"no mount namespace here: {mount_namespace_problem()}")
    repo = Path(__file__).parent.parent.parent
    config = load_config(repo / "examples/cpu.toml")
    harness_config = with_interpreter(config.tasks.harness)
    assert harness_config.require_isolation and config.tasks.suites == (
        "examples/tasks/learnable-long",
    )
    check_isolation(harness_config, run_dir=tmp_path / "run")
    first = load_suite(repo / config.tasks.suites[0])[0]
    suite = tmp_path / "learnable-long"  # a copy: the harness tightens its hidden folders
    shutil.copytree(first.path, suite / first.path.name)
    task = load_task(suite / first.path.name)
    harness = Harness.from_config(
        harness_config, base_url=server.base_url, run_dir=tmp_path / "run"
    )
    harness.hide_suite(suite)
    assert harness.isolated and harness.sealed and harness.mounts is not None
    script = [
        tool_call_message("run", {"command": "id -u"}, "c0"),
        tool_call_message("finish", {}, "c1"),
    ]
    seen: list[dict] = []
    outcome = await run_policy(
        harness, server, bridge, task, "main-job", script_policy(script, seen)
    )
    assert outcome.termination == "finished", (outcome.failure_reason, outcome.stderr_tail)
    ran = next(m["content"] for m in seen if m["role"] == "tool" and "exit code" in m["content"])
    uid = int(ran.split("\n")[1])
    base, count = harness_config.agent_uid_base, harness_config.agent_uid_count
    assert base <= uid < base + count
    stats = harness.statistics()
    assert (stats.isolated, stats.sealed, stats.finished) == (1, 1, 1)


def unreachable_script(folder: Path, name: str = "agent.sh", mode: int = 0o700) -> Path:
    """A shell agent at `folder/name` that prints its uid; `mode` 0700: only root may run it."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / name
    script.write_text("#!/bin/sh\nid -u\n")
    os.chmod(script, mode)
    return script


OPT_OUT = "; set tasks.harness.require_isolation = false to run agents unisolated"


def refusal(command: str, executable: Path, why: str) -> str:
    return (
        f"tasks.harness.require_isolation: {command}: its executable {executable} cannot be "
        f"reached by other users ({why}), so its agent would run as root; make it reachable "
        "(e.g. a venv outside /root) or show it with tasks.harness.visible_paths"
    )


def test_an_agent_executable_other_users_cannot_reach_is_refused_before_the_run(open_dir):
    """Under `require_isolation` an agent command that could only run as root (its executable
    unreachable by agent uids in their namespace: its mode, or under `hidden_paths`) is one
    `ConfigError` from the preflight and from the harness, naming both keys and the path;
    `visible_paths` is a fix; with `require_isolation = false` nothing is refused."""
    from gyre.agents.isolation import check_isolation
    from gyre.config import HarnessConfig
    from gyre.errors import ConfigError
    from gyre.sandbox import network_namespace_problem

    if mount_namespace_problem() is not None or network_namespace_problem() is not None:
        pytest.skip("no mount or network namespace here: the preflight refuses earlier")
    url, run_dir = "http://127.0.0.1:9/v1", open_dir / "run"
    closed = unreachable_script(open_dir / "bin")  # 0700: others can neither read nor run it
    config = HarnessConfig(agent_command=(str(closed),))
    expected = refusal("tasks.harness.agent_command", closed, f"{closed} has mode 700") + OPT_OUT
    with pytest.raises(ConfigError) as refused:
        check_isolation(config, run_dir=run_dir)
    assert str(refused.value) == expected
    with pytest.raises(ConfigError) as refused:
        Harness.from_config(config, base_url=url, run_dir=run_dir)
    assert str(refused.value) == expected
    waived = msgspec.structs.replace(config, require_isolation=False)
    check_isolation(waived, run_dir=run_dir)

    # 0755, but in a folder hidden on purpose: /tmp (private to each agent) shows nothing of it
    hidden = unreachable_script(open_dir / "tools", mode=0o755)
    config = HarnessConfig(agent_command=(str(hidden),), hidden_paths=(str(hidden.parent),))
    with pytest.raises(ConfigError) as refused:
        check_isolation(config, run_dir=run_dir)
    # the topmost covered folder: /tmp, unless the interpreter or gyre live under /tmp (a clone
    # there), which keeps /tmp shown up to them, so the first covered one is open_dir
    import gyre

    bound = (Path(gyre.__file__).resolve(), Path(sys.prefix).resolve())
    top = open_dir if any(str(p).startswith("/tmp/") for p in bound) else "/tmp"
    why = f"{top} is hidden in the agents' mount namespace"
    assert str(refused.value) == refusal("tasks.harness.agent_command", hidden, why) + OPT_OUT
    shown = msgspec.structs.replace(config, visible_paths=(str(hidden),))
    check_isolation(shown, run_dir=run_dir)
    assert Harness.from_config(shown, base_url=url, run_dir=run_dir).isolated


async def test_an_execution_whose_own_command_is_unreachable_fails_and_nothing_runs_as_root(
    open_dir: Path, server
) -> None:
    """A command given to one execution (`Harness.run(agent_command=...)`) that other users
    cannot reach: under `require_isolation` that execution is `failed`, its reason naming the
    path, and nothing of it runs (no folder, no process); it is counted and the next one runs."""
    task = load_task(
        make_task(open_dir / "suite" / "t", toml="[agent]\ndeadline_s = 30.0\n", tests=TESTS)
    )
    harness = agent_harness(server, open_dir)
    assert harness.require_isolation and harness.isolated
    marker = open_dir / "ran"
    closed = unreachable_script(open_dir / "bin")
    closed.write_text(f"#!/bin/sh\nid -u > {marker}\n")
    outcome = await harness.run(task, "closed", agent_command=[str(closed)])
    assert outcome.termination == "failed" and outcome.score is None
    assert outcome.failure_reason == (
        refusal("the agent command", closed, f"{closed} has mode 700") + "; it did not run"
    )
    assert not marker.exists() and not harness.execution_dir("closed").exists()
    stats = harness.statistics()
    assert (stats.running, stats.failed, stats.isolated) == (0, 1, 0)

    control = ExecutionControl(
        refresh=lambda c: c.observe_totals(model_calls=1, completion_tokens=1)
    )
    script = (
        "import os; open('out.txt', 'w').write('mine'); open('secret.txt', 'w').write('x'); "
        "print(os.getuid())"
    )
    after = await harness.run(
        task, "after", agent_command=[PYTHON, "-I", "-c", script], control=control
    )
    assert after.termination == "finished" and after.score.score == 1.0
    assert UID_BASE <= int(after.stdout_tail) < UID_BASE + 64
    stats = harness.statistics()
    assert (stats.finished, stats.failed, stats.isolated) == (1, 1, 1)


async def test_with_isolation_waived_an_unreachable_agent_runs_as_root_with_a_warning(
    open_dir: Path, server, caplog: pytest.LogCaptureFixture
) -> None:
    task = load_task(
        make_task(open_dir / "suite" / "t", toml="[agent]\ndeadline_s = 30.0\n", tests=TESTS)
    )
    harness = agent_harness(server, open_dir, require_isolation=False)
    closed = unreachable_script(open_dir / "bin")
    with caplog.at_level(logging.WARNING, logger="gyre.agents.isolation"):
        outcome = await harness.run(task, "waived", agent_command=[str(closed)])
    assert outcome.stdout_tail.strip() == "0"  # it ran, as root
    assert "before its first model call" in outcome.failure_reason
    assert caplog.messages == [
        f"isolate_uid: agents run as root: {closed} cannot be reached by other users "
        f"({closed} has mode 700)"
    ]
    assert harness.statistics().isolated == 0


def test_unreachable_executable_by_mode_bits_and_relative_commands(tmp_path, monkeypatch):
    """Without a namespace, mode bits of the node's tree decide (pytest's tmp_path lies under a
    0700 folder of root); a relative command with a slash runs from the agent's own workspace,
    so what the node's working folder holds under that name is not judged."""
    from gyre.agents.isolation import unreachable_executable

    closed = unreachable_script(tmp_path, mode=0o755)
    # the first folder from / down that others cannot pass: /tmp/pytest-of-root, 0700
    folder = next(f for f in reversed(closed.parents) if not os.stat(f).st_mode & stat.S_IXOTH)
    mode = stat.S_IMODE(os.stat(folder).st_mode)
    assert unreachable_executable([str(closed)], os.defpath, None, ()) == (
        f"{closed} cannot be reached by other users ({folder} has mode {mode:o})"
    )
    monkeypatch.chdir(tmp_path)
    assert unreachable_executable(["./agent.sh"], os.defpath, None, ()) is None
    assert unreachable_executable(["sh", "-c", "true"], os.defpath, None, ()) is None
