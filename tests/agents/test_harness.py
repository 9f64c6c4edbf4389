"""The harness: deadline from outside, stop reasons, infrastructure failures, isolation."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import anyio
import anyio.from_thread
import anyio.lowlevel
import pytest

from gyre.agents.control import ExecutionControl, mint_api_key
from gyre.agents.harness import Harness
from gyre.tasks.task import load_task
from tests.agents.drive import run_policy
from tests.agents.openai_server import HANG, tool_call_message
from tests.sandbox.test_supervised import EVIL, alive
from tests.tasks.test_task import make_task

pytestmark = pytest.mark.anyio

OUT_TESTS = {
    "test_out.py": (
        "import os\n\n\ndef test_exists():\n    assert os.path.exists('out.txt')\n\n\n"
        "def test_content():\n    assert open('out.txt').read() == 'done'\n"
    )
}


def out_task(tmp_path: Path, agent: str = "deadline_s = 5.0\n", verifier: str = "num_tests = 2\n"):
    toml = f"[agent]\n{agent}\n[verifier]\n{verifier}"
    return load_task(make_task(tmp_path / "suite" / "out", toml=toml, tests=OUT_TESTS))


ONE_MODEL_CALL = """
import json, os, urllib.request
body = json.dumps({"model": "gyre", "messages": [{"role": "user", "content": "hi"}]}).encode()
headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], \
"Content-Type": "application/json"}
urllib.request.urlopen(urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", \
body, headers)).read()
"""


@pytest.mark.slow
async def test_agent_ignoring_sigterm_with_children_is_gone_and_scored(
    tmp_path: Path, harness: Harness, server, bridge
) -> None:
    task = out_task(tmp_path, agent="deadline_s = 10.0\n")
    # the agent writes its pids where the test reads them: no private /tmp (this test is about
    # ending the tree), and a folder every uid may write to
    harness = Harness(
        base_url=server.base_url,
        workspace_root=tmp_path / "plain",
        kill_grace_s=0.5,
        isolate_mounts=False,
        require_isolation=False,
    )
    shared = Path(tempfile.mkdtemp(prefix="gyre-evil-", dir="/tmp"))
    os.chmod(shared, 0o777)
    (shared / "evil.py").write_text(
        ONE_MODEL_CALL + "open('out.txt', 'w').write('partial')\n" + EVIL
    )
    pidfile = shared / "pids"
    try:
        outcome = await run_policy(
            harness,
            server,
            bridge,
            task,
            "evil",
            lambda call: {"role": "assistant", "content": "ok"},
            agent_command=[sys.executable, str(shared / "evil.py"), str(pidfile)],
        )
        pids = [int(p) for p in pidfile.read_text().split()]
    finally:
        shutil.rmtree(shared)
    assert len(pids) >= 3
    assert outcome.termination == "timeout"
    assert outcome.agent_s <= task.spec.agent.deadline_s + 2.0  # bound, not a timing measurement
    assert [p for p in pids if alive(p)] == []
    assert (outcome.score.passed, outcome.score.total, outcome.score.score) == (1, 2, 0.5)
    assert not harness.execution_dir("evil").exists()  # cleaned up after scoring


async def test_agent_dying_before_its_first_model_call_is_failed(
    tmp_path: Path, harness: Harness
) -> None:
    task = out_task(tmp_path)
    outcome = await harness.run(
        task, "dies", agent_command=[sys.executable, "-c", "import sys; sys.exit('boom')"]
    )
    assert outcome.termination == "failed" and outcome.score is None and outcome.reward is None
    assert (
        "before its first model call" in outcome.failure_reason and "boom" in outcome.failure_reason
    )
    assert outcome.exit_code == 1
    outcome = await harness.run(task, "missing", agent_command=["/nonexistent/agent"])
    assert outcome.termination == "failed" and outcome.exit_code == 127
    assert "cannot run '/nonexistent/agent'" in outcome.failure_reason
    assert harness.statistics().failed == 2


@pytest.mark.slow
async def test_nothing_to_train_on_is_failed(tmp_path: Path, harness: Harness) -> None:
    task = out_task(tmp_path, agent="deadline_s = 1.0\n")
    outcome = await harness.run(task, "hangs", agent_command=["sleep", "60"])
    assert outcome.termination == "failed"
    assert outcome.failure_reason.startswith("agent stopped (timeout) before its first model call")
    # calls were made, but every one was aborted before its first token (field case B20)
    control = ExecutionControl(
        refresh=lambda c: c.observe_totals(model_calls=2, completion_tokens=0)
    )
    outcome = await harness.run(task, "empty", agent_command=["true"], control=control)
    assert outcome.termination == "failed"
    assert (
        outcome.failure_reason
        == "no policy tokens: all 2 model calls ended before their first token (aborted)"
    )


async def test_agent_giving_up_after_a_context_refusal_is_context_exceeded(
    tmp_path: Path, harness: Harness
) -> None:
    task = out_task(tmp_path)
    control = ExecutionControl(
        refresh=lambda c: c.observe_totals(model_calls=3, completion_tokens=40, context_refusals=1)
    )
    outcome = await harness.run(
        task,
        "ctx-exit",
        agent_command=["sh", "-c", "echo -n done > out.txt; exit 3"],
        control=control,
    )
    assert outcome.termination == "context_exceeded"
    assert (outcome.score.score, outcome.exit_code, outcome.model_calls) == (1.0, 3, 3)


async def test_reference_agent_is_not_shadowed_by_workspace_files(
    tmp_path: Path, harness: Harness, server, bridge
) -> None:
    task = out_task(tmp_path, agent="deadline_s = 60.0\n")
    (task.environment_dir / "openai.py").write_text("raise SystemExit('shadowed')\n")
    (task.environment_dir / "gyre").mkdir()
    (task.environment_dir / "gyre" / "__init__.py").write_text("raise SystemExit('shadowed')\n")
    script = [
        tool_call_message("write_file", {"path": "out.txt", "content": "done"}, "c0"),
        tool_call_message("finish", {}, "c1"),
    ]
    outcome = await run_policy(
        harness,
        server,
        bridge,
        task,
        "shadow",
        lambda call: script[sum(m["role"] == "assistant" for m in call.messages)],
    )
    assert outcome.termination == "finished", outcome.stderr_tail
    assert outcome.score.score == 1.0


async def test_hanging_verifier_fails_the_execution(
    tmp_path: Path, harness: Harness, server, bridge
) -> None:
    toml = "[agent]\ndeadline_s = 30.0\n[verifier]\nkind = 'script'\ntimeout_s = 1.0\n"
    task = load_task(
        make_task(tmp_path / "s" / "hang", toml=toml, tests={"test.sh": "sleep 300\n"})
    )
    outcome = await run_policy(
        harness, server, bridge, task, "vh", lambda call: tool_call_message("finish", {}, "c0")
    )
    assert outcome.termination == "failed"
    assert "hung: killed after timeout_s=1.0" in outcome.failure_reason
    assert outcome.model_calls == 1


def write_then_loop(call):
    """Writes a partial out.txt, then lists the folder forever."""
    turn = sum(m["role"] == "assistant" for m in call.messages)
    if turn == 0:
        return tool_call_message("write_file", {"path": "out.txt", "content": "partial"}, "c0")
    return tool_call_message("list_dir", {"path": "."}, f"c{turn}")


@pytest.mark.parametrize(
    "agent_limits, reason",
    [("max_turns = 3\n", "turn_limit"), ("token_budget = 100\n", "token_budget")],
)
async def test_limits_stop_the_execution_for_partial_scoring(
    tmp_path: Path, harness: Harness, server, bridge, agent_limits: str, reason: str
) -> None:
    task = out_task(tmp_path, agent="deadline_s = 60.0\n" + agent_limits)
    outcome = await run_policy(harness, server, bridge, task, reason, write_then_loop)
    assert outcome.termination == reason
    assert outcome.stopped and not outcome.failed
    assert (outcome.score.passed, outcome.score.total) == (1, 2)
    if reason == "turn_limit":
        assert outcome.model_calls >= 3
    else:
        assert outcome.completion_tokens >= 100


async def test_context_exceeded_stops_the_execution(
    tmp_path: Path, harness: Harness, server, bridge
) -> None:
    task = out_task(tmp_path, agent="deadline_s = 60.0\n")
    control = ExecutionControl()
    token = anyio.lowlevel.current_token()

    def policy(call):
        if any(
            m["role"] == "assistant" for m in call.messages
        ):  # second call: the prompt no longer fits
            anyio.from_thread.run_sync(control.context_exceeded, token=token)
            return HANG
        return tool_call_message("write_file", {"path": "out.txt", "content": "done"}, "c0")

    outcome = await run_policy(harness, server, bridge, task, "ctx", policy, control=control)
    assert outcome.termination == "context_exceeded"
    assert outcome.score.score == 1.0


async def test_workspace_is_private_and_holds_no_hidden_files(
    tmp_path: Path, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GYRE_NODE_SECRET", "do-not-leak")
    task = out_task(tmp_path)
    (task.path / "solution").mkdir()
    (task.path / "solution" / "oracle.json").write_text('{"main": []}')
    script = "stat -c 'mode %a' .. ; echo WS; ls -A ; echo UP; ls -A .. ; env"
    key = mint_api_key("iso")
    outcome = await harness.run(task, "iso", agent_command=["/bin/sh", "-c", script], api_key=key)
    out = outcome.stdout_tail
    # isolated (root here): the agent passes through its execution folder and the root (0711) but
    # lists neither; otherwise it runs as us and both are ours alone (0700)
    mode = 0o711 if harness.isolated else 0o700
    assert f"mode {mode:o}" in out
    listing = out.split("WS\n")[1].split("UP\n")
    assert listing[0].split() == ["data.txt"]  # the environment template only
    if harness.isolated:  # 0711: the agent cannot list its execution folder
        assert "=" in listing[1].split()[0]  # env's first line: `ls -A ..` listed nothing
    else:
        assert listing[1].split()[:6] == [
            "home",
            "instruction.md",
            "stderr.log",
            "stdout.log",
            "tmp",
            "workspace",
        ]
    assert "test_out" not in out and "oracle" not in out
    assert f"OPENAI_API_KEY={key}" in out and f"OPENAI_BASE_URL={harness.base_url}" in out
    assert "GYRE_EXECUTION_ID=iso" in out
    assert "do-not-leak" not in out
    assert stat.S_IMODE(os.stat(harness.workspace_root).st_mode) == mode


async def test_execution_ids(tmp_path: Path, server) -> None:
    harness = Harness(base_url=server.base_url, workspace_root=tmp_path / "x", keep_workspaces=True)
    task = out_task(tmp_path)
    with pytest.raises(ValueError, match="execution_id='../up'"):
        await harness.run(task, "../up", agent_command=["true"])
    await harness.run(task, "once", agent_command=["true"])
    assert (harness.execution_dir("once") / "workspace" / "data.txt").exists()  # kept on request
    with pytest.raises(FileExistsError):
        await harness.run(task, "once", agent_command=["true"])
    key = mint_api_key("e-1")
    assert key.startswith("gyre-e-1-") and key.rsplit("-", 1)[0] == "gyre-e-1"


async def test_execution_control_limits() -> None:
    control = ExecutionControl(max_turns=2, token_budget=50)
    control.note_model_call(10)
    assert control.reason is None and not control.event.is_set()
    control.note_model_call(10)
    assert control.reason == "turn_limit" and control.event.is_set()
    control.context_exceeded()
    assert control.reason == "turn_limit"  # the first reason wins
    with pytest.raises(ValueError, match="completion_tokens=-1"):
        control.note_model_call(-1)
    with pytest.raises(ValueError, match="not a stop reason"):
        control.stop("finished")
