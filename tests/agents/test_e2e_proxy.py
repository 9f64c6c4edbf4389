"""End to end through the real TITO proxy: harness -> reference agent (own process, `openai` SDK)
-> TitoProxy -> a scripted engine that samples the oracle's tool calls as token IDs -> records.

One task of each suite: the agent's tools run, sub-agent calls are recorded with their role, the
verifier scores 1.0, and the proxy's per-execution totals drive the `ExecutionControl` the way the
main loop does (polling `proxy.summary`). The real vLLM engine in place of the scripted one is
left to the runtime's tests.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import anyio
import pytest

from gyre.agents.control import ExecutionControl
from gyre.agents.harness import Harness
from gyre.agents.oracle import FINISH_SUMMARY
from gyre.config import ProxyConfig
from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from gyre.tasks.solution import Solution, load_solution
from gyre.tasks.task import load_suite

pytest.importorskip("tokenizers")
from gyre.model.recipe import build_tokenizer  # noqa: E402
from gyre.tito.proxy import TitoProxy  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


def reply_texts(solution: Solution) -> list[tuple[str, str]]:
    """(role, text) of every model call the oracle-driven agent makes, in request order."""

    def call(name: str, arguments: dict) -> str:
        return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"

    out = []
    for step in solution.main:
        out.append(("main", call(step.tool, step.arguments)))
        if step.tool == "delegate":
            for sub in solution.sub_agents[step.arguments["task"]]:
                out.append(("sub_agent", call(sub.tool, sub.arguments)))
            out.append(("sub_agent", call("finish", {"summary": FINISH_SUMMARY})))
    out.append(("main", call("finish", {"summary": FINISH_SUMMARY})))
    return out


async def feed_control(proxy: TitoProxy, execution_id: str, control: ExecutionControl) -> None:
    """What the main loop does until the proxy reports calls itself: poll the running totals
    (live limits); the harness refreshes once more when the agent stops (exact counts)."""
    while True:
        control.refresh()
        await anyio.sleep(0.05)


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("suite", ["learnable", "terminal-mini", "nl2repo-mini", "multiagent-mini"])
async def test_reference_agent_through_the_proxy(suite: str, tmp_path: Path) -> None:
    tok = build_tokenizer()
    task = random.Random(suite).choice(load_suite(EXAMPLES / suite))
    script = reply_texts(load_solution(task))
    replies = [
        ScriptedReply(token_ids=tok.encode(text, add_special_tokens=False) + [tok.eos_token_id])
        for _, text in script
    ]
    engine = ScriptedEngine(
        replies, eos_token_id=tok.eos_token_id, max_model_len=65536, vocab_size=len(tok)
    )
    proxy = TitoProxy(tokenizer=tok, engine_for=lambda _e: engine, config=ProxyConfig())
    eid = f"e2e-{suite}"
    key = proxy.mint_key(eid)

    def refresh(c: ExecutionControl) -> None:
        s = proxy.summary(eid)
        c.observe_totals(
            model_calls=s.num_calls,
            completion_tokens=s.completion_tokens,
            context_refusals=s.context_refusals,
        )

    control = ExecutionControl(refresh=refresh)
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.serve)
        harness = Harness(base_url=f"http://127.0.0.1:{port}/v1", workspace_root=tmp_path / "x")
        tg.start_soon(feed_control, proxy, eid, control)
        outcome = await harness.run(task, eid, control=control, api_key=key)
        tg.cancel_scope.cancel()
    calls = proxy.calls(eid)
    assert outcome.termination == "finished", outcome
    assert outcome.score.score == 1.0 and outcome.score.all_passed
    assert [c.role for c in calls] == [role for role, _ in script]
    assert [c.completion_ids for c in calls] == [r.token_ids for r in replies]
    assert outcome.model_calls == len(calls)
    if suite == "multiagent-mini":
        assert {c.role for c in calls} == {"main", "sub_agent"}
