"""The reference agent against the scripted server: tools, delegation, compaction, tool errors."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from gyre.agents.react import COMPACT_PROMPT, Agent, AgentSettings, main
from gyre.agents.tools import SUB_AGENT_PROMPT, SYSTEM_PROMPT, TOOL_SCHEMAS, Workspace
from tests.agents.openai_server import tool_call_message

KEY = "gyre-test-0000"


def make_agent(server, tmp_path: Path, **settings) -> Agent:
    root = tmp_path / "ws"
    root.mkdir(exist_ok=True)
    client = openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)
    return Agent(client, Workspace(root), AgentSettings(**settings))


def turn(call) -> int:
    return sum(m["role"] == "assistant" for m in call.messages)


def test_delegate_runs_a_sub_agent_with_its_own_history(server, tmp_path: Path) -> None:
    def policy(call):
        if call.role == "sub_agent":
            if turn(call) == 0:
                return tool_call_message("write_file", {"path": "part.txt", "content": "sub"}, "s0")
            return tool_call_message("finish", {"summary": "part written"}, "s1")
        if turn(call) == 0:
            return tool_call_message("delegate", {"task": "write part.txt"}, "m0")
        return tool_call_message("finish", {"summary": "all done"}, "m1")

    server.register(KEY, policy)
    agent = make_agent(server, tmp_path)
    assert agent.converse("build it") == "all done"
    calls = server.calls_for(KEY)
    assert [c.role for c in calls] == ["main", "sub_agent", "sub_agent", "main"]
    assert calls[1].messages == [
        {"role": "system", "content": SUB_AGENT_PROMPT},
        {"role": "user", "content": "write part.txt"},
    ]
    assert "delegate" not in [t["function"]["name"] for t in calls[1].tools]
    assert [t["function"]["name"] for t in calls[0].tools] == [t["function"]["name"] for t in TOOL_SCHEMAS]
    assert calls[3].messages[-1] == {"role": "tool", "tool_call_id": "m0", "content": "part written"}
    assert calls[3].messages[:2] == [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "build it"}]
    assert (agent.workspace.root / "part.txt").read_text() == "sub"


def test_path_escape_is_a_tool_error_for_the_model(server, tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("secret")
    script = [
        tool_call_message("read_file", {"path": "../secret.txt"}, "c0"),
        tool_call_message("write_file", {"path": "../../evil.txt", "content": "x"}, "c1"),
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c2", "type": "function", "function": {"name": "run", "arguments": "{not json"}}]},
        tool_call_message("fly", {}, "c3"),
        tool_call_message("finish", {"summary": "ok"}, "c4"),
    ]
    server.register(KEY, lambda call: script[turn(call)])
    agent = make_agent(server, tmp_path)
    assert agent.converse("try") == "ok"
    results = [m["content"] for m in server.calls_for(KEY)[-1].messages if m["role"] == "tool"]
    assert results[0] == "error: path '../secret.txt' is outside the workspace"
    assert results[1] == "error: path '../../evil.txt' is outside the workspace"
    assert results[2].startswith("error: invalid arguments for run:")
    assert results[3] == "error: unknown tool 'fly'"
    assert not (tmp_path.parent / "evil.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret.txt", "ws"]


def test_compaction_summarises_and_restarts(server, tmp_path: Path) -> None:
    def policy(call):
        if call.role == "main_summary":
            return {"role": "assistant", "content": "wrote f0 and f1"}
        t = turn(call)
        if t >= 3 or any("Progress so far" in (m.get("content") or "") for m in call.messages if m["role"] == "user"):
            return tool_call_message("finish", {"summary": "done"}, "fin")
        return tool_call_message("write_file", {"path": f"f{t}", "content": "x" * 200}, f"c{t}")

    server.register(KEY, policy)
    agent = make_agent(server, tmp_path, compact_chars=1200)
    assert agent.converse("write files") == "done"
    calls = server.calls_for(KEY)
    roles = [c.role for c in calls]
    assert "main_summary" in roles
    summary_call = calls[roles.index("main_summary")]
    assert summary_call.messages[-1] == {"role": "user", "content": COMPACT_PROMPT}
    assert summary_call.tools is None
    after = calls[roles.index("main_summary") + 1]
    assert after.role == "main"
    assert after.messages == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "write files\n\nProgress so far:\nwrote f0 and f1"},
    ]


def test_plain_answer_ends_and_cut_off_reply_continues(server, tmp_path: Path) -> None:
    server.register(KEY, lambda call: {"role": "assistant", "content": "I am done."})
    assert make_agent(server, tmp_path).converse("x") == "I am done."
    agent = make_agent(server, tmp_path, max_turns=3)
    server.register(KEY, lambda call: tool_call_message("list_dir", {}, f"c{turn(call)}"))
    assert agent.converse("x") == "stopped after 3 turns"
    assert agent.model_calls == 3


def test_main_reports_api_failure(server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "gyre-unknown-key")
    instruction = tmp_path / "instruction.md"
    instruction.write_text("do it")
    monkeypatch.setenv("GYRE_INSTRUCTION_FILE", str(instruction))
    (tmp_path / "w").mkdir()
    assert main(["--workspace", str(tmp_path / "w"), "--request-timeout-s", "5"]) == 3
    server.register("gyre-unknown-key", lambda call: tool_call_message("finish", {"summary": "s"}, "c"))
    assert main(["--workspace", str(tmp_path / "w")]) == 0
    assert json.loads(json.dumps(server.calls[-1].messages))[1] == {"role": "user", "content": "do it"}
