"""The scripted long-horizon agent: its tool work is real file work and reproducible; against a
fake client it compacts and delegates exactly where its settings say, with the right
`X-Gyre-Role` headers and fresh histories; through the harness and the real TITO proxy (scripted
engine) its execution is a tree of main, summary and sub-agent paths whose token count equals the
agent's own count from `usage`, and it scores 1.0 on a `longtail` task."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import anyio
import pytest

from gyre.agents.control import ExecutionControl
from gyre.agents.harness import Harness
from gyre.agents.long_horizon import (
    RESULT_FILE,
    SUMMARY_REQUEST,
    WORK_DIR,
    LongHorizonAgent,
    LongHorizonSettings,
    ToolScript,
    long_horizon_command,
    main,
)
from gyre.config import ProxyConfig
from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from gyre.tasks.task import load_suite

pytest.importorskip("tokenizers")
from gyre.model.recipe import build_tokenizer  # noqa: E402
from gyre.tito.proxy import TitoProxy  # noqa: E402
from gyre.tito.records import ExecutionTokens  # noqa: E402
from gyre.trajectory.tree import build_tree  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


def test_tool_script_does_real_file_work_and_is_reproducible(tmp_path: Path) -> None:
    a = ToolScript(tmp_path / "a", seed=7, output_chars=300)
    b = ToolScript(tmp_path / "b", seed=7, output_chars=300)
    outputs = [a.run_next() for _ in range(40)]
    assert outputs == [b.run_next() for _ in range(40)]  # the same seed, the same work
    assert outputs != [ToolScript(tmp_path / "c", 8, 300).run_next() for _ in range(40)]
    assert outputs[0].startswith(f"$ write {WORK_DIR}/mod_0.py\n")
    kinds = {o.split()[1] for o in outputs}
    assert kinds == {"write", "cat", "append", "grep", "ls"}  # every operation ran
    root = tmp_path / "a" / WORK_DIR
    assert sorted(p.name for p in root.iterdir()) == sorted(a.files)
    # written files hold about output_chars characters, appends a third of that more
    assert all(300 <= (root / f).stat().st_size < 300 * 6 for f in a.files)


def test_reads_echo_the_file_as_it_is_on_disk(tmp_path: Path) -> None:
    script = ToolScript(tmp_path, seed=3, output_chars=200)
    root = tmp_path / WORK_DIR
    reads = 0
    for _ in range(60):
        out = script.run_next()
        if out.startswith("$ cat "):
            name = out.split()[2].removeprefix(f"{WORK_DIR}/")
            assert out.split("\n", 1)[1] == (root / name).read_text()[-200:]
            reads += 1
        elif out.startswith("$ append "):
            name = out.split()[2].removeprefix(f"{WORK_DIR}/")
            assert (root / name).read_text().endswith(out.split("\n", 1)[1])
    assert reads >= 10


class _FakeClient:
    """The slice of `openai.OpenAI` the agent uses. Prompt tokens = 1 per message character of
    the JSON history (a stand-in tokenizer); each reply is `r<n>` with 3 completion tokens."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, list[dict]]] = []
        self.chat = self
        self.completions = self

    def create(self, *, model, messages, max_tokens, temperature, extra_headers):
        self.requests.append((extra_headers["X-Gyre-Role"], json.loads(json.dumps(messages))))
        msg = SimpleNamespace(content=f"r{len(self.requests)}", tool_calls=None)
        usage = SimpleNamespace(prompt_tokens=len(json.dumps(messages)), completion_tokens=3)
        return SimpleNamespace(choices=[SimpleNamespace(message=msg)], usage=usage)


def test_compaction_and_sub_agents_follow_the_settings(tmp_path: Path) -> None:
    settings = LongHorizonSettings(
        min_calls=40,
        target_tokens=0,
        compact_at_tokens=3000,
        tool_output_chars=400,
        sub_agent_every=6,
        sub_agent_calls=3,
    )
    client = _FakeClient()
    progress = LongHorizonAgent(client, "build it", tmp_path, settings, seed=1).run()
    roles = [r for r, _ in client.requests]
    assert progress.calls == len(roles) == 40
    assert progress.calls_by_role == {r: roles.count(r) for r in set(roles)}
    # main turn 6 delegates: the sub-agent's 3 calls come right after that main call
    main_idx = [i for i, r in enumerate(roles) if r in ("main", "main_summary")]
    sixth_main = [i for i, r in enumerate(roles) if r == "main"][5]
    assert roles[sixth_main + 1 : sixth_main + 4] == ["sub_agent"] * 3
    for i, (role, messages) in enumerate(client.requests):
        if role == "sub_agent" and roles[i - 1] != "sub_agent":  # a sub-agent's first call
            assert messages[0]["content"].startswith("You are a sub-agent")
            assert len(messages) == 2  # its own history, nothing of the main one
    # a summary call is the whole history + the request; the next call starts a fresh history
    summaries = [i for i, r in enumerate(roles) if r == "main_summary"]
    assert len(summaries) == progress.compactions >= 2
    for i in summaries:
        messages = client.requests[i][1]
        assert messages[-1] == {"role": "user", "content": SUMMARY_REQUEST}
        assert len(json.dumps(messages[:-1])) + 3 >= 3000  # it passed the threshold
        nxt = client.requests[min(j for j in main_idx if j > i)][1]
        assert nxt[:2] == messages[:2] and len(nxt) == 3
        assert nxt[2]["content"].startswith("Summary of the work so far (compaction ")
        assert f"\nr{i + 1}\n" in nxt[2]["content"]  # the summary reply is carried over
    # tokens: per call, prompt beyond the context it extends + completion (by hand from requests)
    expected, context = 0, {}
    for role, messages in client.requests:
        key = "sub" if role.startswith("sub") else "main"
        prompt = len(json.dumps(messages))
        if len(messages) <= 3:  # a fresh history: system, task (and a summary after compaction)
            context[key] = 0
        expected += prompt - context.get(key, 0) + 3
        context[key] = prompt + 3
    assert progress.tokens == expected
    result = json.loads((tmp_path / RESULT_FILE).read_text())
    assert result["turns_done"] == 40 and result["finished"] is True
    assert result["compactions"] == progress.compactions
    # one delegation per 6 main turns: 25 main calls = 40 - 3 summaries - 4 sub-agents x 3
    assert progress.calls_by_role["main"] == 25 and result["sub_agents"] == 25 // 6 == 4


def test_bad_settings_raise() -> None:
    with pytest.raises(ValueError, match="min_calls=0"):
        LongHorizonSettings(min_calls=0)
    with pytest.raises(ValueError, match="max_calls=5 must be >= min_calls=10"):
        LongHorizonSettings(min_calls=10, max_calls=5)
    with pytest.raises(ValueError, match="sub_agent_every=-1"):
        LongHorizonSettings(sub_agent_every=-1)
    with pytest.raises(SystemExit):
        main(["--instruction", "x", "--seed", "1", "--compact-at-tokens", "0"])


def test_command_round_trips_the_settings() -> None:
    s = LongHorizonSettings(min_calls=12, target_tokens=999, temperature=0.7, sub_agent_every=0)
    cmd = long_horizon_command(s)
    assert cmd[:4][-2:] == ("-m", "gyre.agents.long_horizon")
    args = dict(zip(cmd[4::2], cmd[5::2]))
    assert args["--min-calls"] == "12" and args["--target-tokens"] == "999"
    assert args["--temperature"] == "0.7" and args["--sub-agent-every"] == "0"


def scripted_proxy(max_tokens_reply: int = 24):
    """The real proxy on a scripted engine whose n-th reply is text (`step n ...`, which
    re-encodes to itself) of about `max_tokens_reply` tokens, then EOS."""
    tok = build_tokenizer()

    def rule(request, index: int, vocab_size: int) -> ScriptedReply:
        n = len(engine.requests_seen)
        text = f"step {n}: " + " ".join(["read the file and run the test"] * 4)
        return ScriptedReply(
            token_ids=tok.encode(text, add_special_tokens=False)[:max_tokens_reply]
        )

    engine = ScriptedEngine(
        rule=rule, eos_token_id=tok.eos_token_id, max_model_len=131072, vocab_size=len(tok)
    )
    return TitoProxy(tokenizer=tok, engine_for=lambda _e: engine, config=ProxyConfig())


async def run_through_proxy(tmp_path: Path, settings: LongHorizonSettings, eid: str):
    task = load_suite(EXAMPLES / "longtail")[0]
    proxy = scripted_proxy()
    key = proxy.mint_key(eid)

    def refresh(c: ExecutionControl) -> None:
        s = proxy.summary(eid)
        c.observe_totals(
            model_calls=s.num_calls,
            completion_tokens=s.completion_tokens,
            context_refusals=s.context_refusals,
        )

    control = ExecutionControl(refresh=refresh, max_turns=100000, token_budget=10**9)
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.serve)
        harness = Harness(
            base_url=f"http://127.0.0.1:{port}/v1",
            workspace_root=tmp_path / "x",
            kill_grace_s=0.5,
            keep_workspaces=True,
        )
        outcome = await harness.run(
            task,
            eid,
            control=control,
            api_key=key,
            agent_command=list(long_horizon_command(settings)),
        )
        calls = proxy.calls(eid)
        tg.cancel_scope.cancel()
    return outcome, calls, tmp_path / "x"


@pytest.mark.anyio
async def test_execution_through_the_proxy_is_a_tree_of_roles(tmp_path: Path) -> None:
    settings = LongHorizonSettings(
        min_calls=45,
        target_tokens=12000,
        compact_at_tokens=2500,
        tool_output_chars=500,
        sub_agent_every=8,
        sub_agent_calls=3,
        max_tokens=24,
    )
    outcome, calls, root = await run_through_proxy(tmp_path, settings, "long-0")
    assert outcome.termination == "finished", outcome
    assert outcome.score.score == 1.0
    result = json.loads(next(root.rglob(RESULT_FILE)).read_text())
    assert result["turns_done"] == len(calls) == outcome.model_calls >= 45
    assert result["tokens"] >= 12000 and result["compactions"] >= 2 and result["sub_agents"] >= 4
    by_role = {r: sum(c.role == r for c in calls) for r in ("main", "main_summary", "sub_agent")}
    assert by_role["main_summary"] == result["compactions"]
    assert by_role["sub_agent"] == 3 * result["sub_agents"]
    # the agent's token count (from usage) equals one from the records: each call's prompt beyond
    # the prompt + completion of the call it extends, plus its completion
    by_id = {c.call_id: c for c in calls}
    tokens = ExecutionTokens(calls)
    counted = 0
    for c in calls:
        parent = by_id.get(c.parent_call_id or "")
        extends = 0
        if parent is not None and c.divergence is None:
            extends = parent.prompt_len + len(parent.completion_ids)
            assert tokens.sequence(c.call_id, extends) == tokens.sequence(parent.call_id)
        counted += c.prompt_len - extends + len(c.completion_ids)
    assert counted == result["tokens"]
    tree = build_tree(calls)
    stats = tree.statistics()
    # fresh histories share only their system prompt + task with the tree: the tree holds fewer
    # tokens than the count, and more than the count less those shared heads
    first = calls[0]
    fresh = sum(1 for c in calls if c is not first and (c.parent_call_id is None or c.divergence))
    assert counted - fresh * first.prompt_len <= stats.unique_tokens <= counted
    assert set(tree.leaf_roles(tree.leaves())) >= {"main", "main_summary", "sub_agent"}
