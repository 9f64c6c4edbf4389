"""Real agent frameworks through the proxy's Responses API: the OpenAI Agents SDK for Python with
its default model and settings (the Responses model) runs a 10-turn function-tool task, and the
calls it makes form one trajectory path, token for token."""

from __future__ import annotations

import pytest

from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from gyre.trajectory import build_tree
from tests.tito.conftest import encode, make_proxy, serving

agents = pytest.importorskip("agents", reason="openai-agents is in the [test] extra")
openai = pytest.importorskip("openai")

pytestmark = pytest.mark.anyio
TURNS = 10


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the Agents SDK runs on asyncio only


def script(tok) -> list[list[int]]:
    """Turns 0..8 think and call `step(k)`; turn 9 answers."""
    eos = tok.eos_token_id
    texts = [
        f'<think>step {k}</think>\n<tool_call>{{"name": "step", "arguments": {{"k": {k}}}}}'
        "</tool_call>"
        for k in range(TURNS - 1)
    ] + ["<think>all done</think>\nDone after 9 steps."]
    return [encode(tok, t) + [eos] for t in texts]


async def test_agents_sdk_default_settings_ten_turns_one_path(tok, anyio_backend):
    ids = script(tok)
    engine = ScriptedEngine(  # the tokenizer: the SDK's strict tools are a grammar to enforce
        [ScriptedReply(token_ids=i) for i in ids],
        eos_token_id=tok.eos_token_id,
        tokenizer=tok,
        vocab_size=len(tok),
    )
    proxy = make_proxy(tok, engine, accept_any_model=True)  # the SDK's own default model name
    key = proxy.mint_key("agent")
    seen: list[int] = []

    @agents.function_tool
    def step(k: int) -> str:
        """Do step k."""
        seen.append(k)
        return f"step {k} ok"

    async with serving(proxy) as base:
        client = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0)
        agents.set_default_openai_client(client, use_for_tracing=False)
        agents.set_tracing_disabled(True)
        agent = agents.Agent(name="stepper", instructions="Do the steps.", tools=[step])
        result = await agents.Runner.run(agent, "Do 9 steps.", max_turns=TURNS)
        await client.close()
    assert result.final_output == "Done after 9 steps."
    assert seen == list(range(TURNS - 1))
    calls = proxy.calls("agent", full=True)
    assert len(calls) == TURNS
    assert [c.completion_ids for c in calls] == ids
    assert [c.divergence for c in calls] == [None] * TURNS
    stats = build_tree(calls).statistics()
    assert stats.branches == 1 and stats.calls == TURNS
    last = calls[-1]
    assert stats.depth == len(last.prompt_ids) + len(last.completion_ids)
    # the SDK's default settings for its default model reach the chat template as kwargs
    node = proxy.sessions.get("agent").render.nodes[0]
    assert node.template_kwargs == {
        "reasoning_effort": "none",
        "enable_thinking": False,
        "verbosity": "low",
    }
