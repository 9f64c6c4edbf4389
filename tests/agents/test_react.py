"""The reference agent against the scripted server: tools, delegation, compaction, tool errors,
malformed tool calls fed back with bounded retries (B30, also through the real proxy)."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import openai
import pytest

from gyre.agents.react import (
    COMPACT_PROMPT,
    EXIT_MALFORMED,
    Agent,
    AgentSettings,
    history_chars,
    main,
    progress_prompt,
)
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
    assert [t["function"]["name"] for t in calls[0].tools] == [
        t["function"]["name"] for t in TOOL_SCHEMAS
    ]
    assert calls[3].messages[-1] == {
        "role": "tool",
        "tool_call_id": "m0",
        "content": "part written",
    }
    assert calls[3].messages[:2] == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "build it"},
    ]
    assert (agent.workspace.root / "part.txt").read_text() == "sub"


def test_path_escape_is_a_tool_error_for_the_model(server, tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("secret")
    script = [
        tool_call_message("read_file", {"path": "../secret.txt"}, "c0"),
        tool_call_message("write_file", {"path": "../../evil.txt", "content": "x"}, "c1"),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "run", "arguments": "{not json"},
                }
            ],
        },
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
    assert results[3].startswith("error: unknown tool 'fly'; the tools are read_file, write_file")
    assert not (tmp_path.parent / "evil.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret.txt", "ws"]


def test_compaction_summarises_and_restarts(server, tmp_path: Path) -> None:
    def policy(call):
        if call.role == "main_summary":
            return {"role": "assistant", "content": "wrote f0 and f1"}
        t = turn(call)
        if t >= 3 or any(
            "Progress so far" in (m.get("content") or "")
            for m in call.messages
            if m["role"] == "user"
        ):
            return tool_call_message("finish", {"summary": "done"}, "fin")
        return tool_call_message("write_file", {"path": f"f{t}", "content": "x" * 200}, f"c{t}")

    server.register(KEY, policy)
    # history_chars after 2 writes: 101 (system) + 11 (task) + 2 x (10 + 229 + 26) = 642
    agent = make_agent(server, tmp_path, compact_chars=600)
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


def test_history_chars_counts_what_the_model_reads_not_ids() -> None:
    call = {"name": "write_file", "arguments": '{"path": "a", "content": "b"}'}
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c0", "function": call}]},
        {"role": "tool", "tool_call_id": "c0", "content": "wrote 1 characters to a"},
    ]
    assert history_chars(messages) == 3 + 4 + 10 + 29 + 23
    long_ids = json.loads(json.dumps(messages).replace('"c0"', '"call_x123-0909d-t20-g3_c4_0"'))
    assert history_chars(long_ids) == history_chars(messages)
    assert history_chars([{"role": "assistant", "content": "hi", "tool_calls": None}]) == 2
    assert progress_prompt("do it", "half done") == "do it\n\nProgress so far:\nhalf done"


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
    server.register(
        "gyre-unknown-key", lambda call: tool_call_message("finish", {"summary": "s"}, "c")
    )
    assert main(["--workspace", str(tmp_path / "w")]) == 0
    assert json.loads(json.dumps(server.calls[-1].messages))[1] == {
        "role": "user",
        "content": "do it",
    }


def test_malformed_tool_calls_are_fed_back_then_end_the_conversation(
    server, tmp_path: Path
) -> None:
    """Missing argument, bad JSON, unknown tool: each a tool error for the model; a well-formed
    reply resets the count; past `max_malformed_replies` in a row the conversation ends."""
    bad_json = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "b",
                "type": "function",
                "function": {"name": "write_file", "arguments": '{"path": "a"'},
            }
        ],
    }
    script = [
        tool_call_message("write_file", {"path": "a.txt"}, "c0"),  # no content: not an empty file
        tool_call_message("list_dir", {}, "c1"),  # well-formed: the count starts again
        bad_json,
        tool_call_message("fly", {}, "c3"),
        tool_call_message("write_file", {"path": "a.txt", "content": 7}, "c4"),
        tool_call_message("finish", {"summary": "never reached"}, "c5"),
    ]
    server.register(KEY, lambda call: script[turn(call)])
    agent = make_agent(server, tmp_path, max_malformed_replies=2)
    summary = agent.converse("try")
    assert summary == (
        "stopped after 3 replies in a row with a malformed tool call; "
        "the last: write_file: argument 'content' must be a string"
    )
    assert agent.stop_reason == summary and agent.model_calls == 5 and agent.malformed_replies == 4
    results = [m["content"] for m in server.calls_for(KEY)[-1].messages if m["role"] == "tool"]
    assert results == [
        "error: write_file is missing its argument 'content'",
        "(empty)",
        "error: invalid arguments for write_file: "
        "Expecting ',' delimiter: line 1 column 13 (char 12)",
        "error: unknown tool 'fly'; the tools are "
        "read_file, write_file, list_dir, run, finish, delegate",
    ]
    assert not (agent.workspace.root / "a.txt").exists()


def test_main_exits_with_the_malformed_status(
    server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    server.register(KEY, lambda call: tool_call_message("fly", {}, f"c{turn(call)}"))
    (tmp_path / "w").mkdir()
    argv = [
        "--instruction",
        "x",
        "--workspace",
        str(tmp_path / "w"),
        "--max-malformed-replies",
        "1",
    ]
    assert main(argv) == EXIT_MALFORMED
    assert len(server.calls_for(KEY)) == 2


@pytest.mark.anyio
async def test_b30_malformed_tool_call_is_fed_back_through_the_proxy(
    tmp_path: Path, anyio_backend
) -> None:
    """field case B30: the first reply is a `write_file` call whose JSON lacks its closing brace;
    the second a valid `write_file` and `finish`. Buggy: 1 call, the text taken as the answer."""
    from gyre.config import ProxyConfig
    from gyre.engines.scripted import ScriptedEngine, ScriptedReply
    from gyre.model.recipe import build_tokenizer
    from gyre.tito.proxy import TitoProxy

    tok = build_tokenizer()

    def call(name: str, arguments: dict) -> str:
        return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"

    write = call("write_file", {"path": "out.txt", "content": "hello"})
    texts = [
        write.replace("}}</tool_call>", "}</tool_call>"),
        write + call("finish", {"summary": "wrote it"}),
    ]
    replies = [
        ScriptedReply(token_ids=tok.encode(t, add_special_tokens=False) + [tok.eos_token_id])
        for t in texts
    ]
    engine = ScriptedEngine(
        replies, eos_token_id=tok.eos_token_id, vocab_size=len(tok), max_model_len=8192
    )
    proxy = TitoProxy(tokenizer=tok, engine_for=lambda _e: engine, config=ProxyConfig())
    key = proxy.mint_key("b30")
    (tmp_path / "ws").mkdir()
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.serve)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)
        agent = Agent(client, Workspace(tmp_path / "ws"), AgentSettings())
        summary = await anyio.to_thread.run_sync(agent.converse, "write hello to out.txt")
        tg.cancel_scope.cancel()
    calls = proxy.calls("b30", full=True)
    assert len(calls) == 2 and summary == "wrote it" and agent.malformed_replies == 1
    assert (tmp_path / "ws" / "out.txt").read_text() == "hello"
    second_prompt = tok.decode(calls[1].prompt_ids)
    assert "error: your tool call could not be parsed (malformed tool call: " in second_prompt
    assert "Expecting" in second_prompt.split("could not be parsed", 1)[1]  # json's parse error
    assert calls[1].divergence is None  # the malformed text was echoed back token for token


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])  # the node's loop; an agent process is slow
async def test_b30_through_the_harness_finishes_with_its_normal_score(
    tmp_path: Path, anyio_backend
) -> None:
    """B30 end to end: harness -> reference agent (own process) -> proxy -> scripted engine; the
    malformed first call costs one model call and the verifier scores the task as usual."""
    from gyre.agents.control import ExecutionControl
    from gyre.agents.harness import Harness
    from gyre.config import ProxyConfig
    from gyre.engines.scripted import ScriptedEngine, ScriptedReply
    from gyre.model.recipe import build_tokenizer
    from gyre.tasks.task import load_task
    from gyre.tito.proxy import TitoProxy
    from tests.tasks.test_task import make_task

    tests = {"test_out.py": "def test_content():\n    assert open('out.txt').read() == 'done'\n"}
    toml = "[agent]\ndeadline_s = 60.0\n[verifier]\nnum_tests = 1\n"
    task = load_task(make_task(tmp_path / "suite" / "out", toml=toml, tests=tests))
    tok = build_tokenizer()

    def call(name: str, arguments: dict) -> str:
        return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"

    write = call("write_file", {"path": "out.txt", "content": "done"})
    texts = [write.replace("}}</tool_call>", "}</tool_call>"), write + call("finish", {})]
    engine = ScriptedEngine(
        [
            ScriptedReply(token_ids=tok.encode(t, add_special_tokens=False) + [tok.eos_token_id])
            for t in texts
        ],
        eos_token_id=tok.eos_token_id,
        vocab_size=len(tok),
        max_model_len=8192,
    )
    proxy = TitoProxy(tokenizer=tok, engine_for=lambda _e: engine, config=ProxyConfig())
    key = proxy.mint_key("b30")

    def refresh(c: ExecutionControl) -> None:  # what the main loop does: the proxy's totals
        totals = proxy.summary("b30")
        c.observe_totals(
            model_calls=totals.num_calls,
            completion_tokens=totals.completion_tokens,
            context_refusals=totals.context_refusals,
        )

    control = ExecutionControl(refresh=refresh)
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.serve)
        harness = Harness(base_url=f"http://127.0.0.1:{port}/v1", workspace_root=tmp_path / "x")
        outcome = await harness.run(task, "b30", control=control, api_key=key)
        tg.cancel_scope.cancel()
    assert outcome.termination == "finished", outcome.stderr_tail
    assert outcome.score.score == 1.0 and outcome.model_calls == 2
    assert len(proxy.calls("b30", full=True)) == 2


@pytest.mark.parametrize("id_prefix", ["c", "call_x123-0909d-t20-g3_c"])
def test_b31_agent_compacts_where_the_warm_start_demonstrations_do(
    server, tmp_path: Path, id_prefix: str
) -> None:
    """B31, a field case of the main job: the agent measured its history as JSON, tool-call IDs
    included (the proxy's are 25-30 characters, the demonstrations' 6), so it compacted a turn
    earlier than the warm start had learned, and every summary dropped note2's pending chore.
    Played perfectly with short IDs or proxy-length ones, the agent's summary request must be
    the demonstrations' compaction conversation."""
    from gyre.model.demonstrations import chain_conversations
    from gyre.tasks.suites.learnable_long import (
        COMPACT_CHARS,
        COMPACTIONS,
        INSTRUCTION,
        LongChore,
    )

    chore = LongChore(
        words=("agent", "class", "config", "error"),
        files=("main.txt", "test.txt", "input.txt", "spec.txt"),
        delegated=3,
    )
    root = tmp_path / "ws"
    root.mkdir()
    for name, text in chore.environment().items():
        (root / name).write_text(text)
    solution = chore.solution()
    done = {"main": 0, "sub": 0}

    def policy(call):
        call_id = f"{id_prefix}{len(server.calls_for(KEY))}_0"
        if call.role == "main_summary":
            return {"role": "assistant", "content": chore.summary_after(done["main"])}
        if call.role == "sub_agent":
            (write,) = solution.sub_agents[chore.sub_task()]
            done["sub"] += 1
            if done["sub"] == 1:
                return tool_call_message("write_file", dict(write.arguments), call_id)
            return tool_call_message("finish", {"summary": "done"}, call_id)
        done["main"] += 1
        if done["main"] > len(solution.main):
            return tool_call_message("finish", {"summary": "done"}, call_id)
        step = solution.main[done["main"] - 1]
        return tool_call_message(step.tool, dict(step.arguments), call_id)

    server.register(KEY, policy)
    agent = make_agent(server, tmp_path, compact_chars=COMPACT_CHARS)
    assert agent.converse(INSTRUCTION) == "done"

    def without_ids(messages: list[dict]) -> list[dict]:
        out = []
        for m in messages:
            m = {k: v for k, v in m.items() if k != "tool_call_id"}
            if m.get("tool_calls"):
                m["tool_calls"] = [
                    {k: v for k, v in c.items() if k != "id"} for c in m["tool_calls"]
                ]
            out.append(m)
        return out

    summary_demos = [d for d in chain_conversations(chore) if d.get("loss") == "last"]
    asked = [c for c in server.calls_for(KEY) if c.role == "main_summary"]
    assert len(asked) == len(summary_demos) == COMPACTIONS
    for call, demo in zip(asked, summary_demos):
        assert without_ids(call.messages) == without_ids(demo["messages"][:-1])
    # each right after a note is read, its chore pending
    assert [d["messages"][-1]["content"] for d in summary_demos] == [
        chore.note(i) for i in range(1, 4)
    ]
    assert sorted(p.name for p in root.iterdir() if p.name not in chore.environment()) == sorted(
        chore.files
    )
