"""A second real client, not written here: LangChain's ChatOpenAI drives a multi-turn tool task."""

from __future__ import annotations

import anyio
import pytest

from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from tests.tito.conftest import encode, make_proxy, serving

langchain_openai = pytest.importorskip(
    "langchain_openai", reason="langchain-openai is in the [test] extra"
)
messages_mod = pytest.importorskip("langchain_core.messages")
tools_mod = pytest.importorskip("langchain_core.tools")

pytestmark = pytest.mark.anyio


async def test_langchain_chatopenai_multi_turn_tool_task(tok, anyio_backend):
    @tools_mod.tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    eos = tok.eos_token_id
    script = [
        '<think>first 6*7</think>\n<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}'
        "</tool_call>",
        '<tool_call>{"name": "multiply", "arguments": {"a": 42, "b": 2}}</tool_call>',
        "The answer is 84.",
    ]
    replies = [ScriptedReply(token_ids=encode(tok, s) + [eos]) for s in script]
    engine = ScriptedEngine(replies, eos_token_id=eos)
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("lc")
    async with serving(proxy) as base:

        def run_agent() -> str:
            llm = langchain_openai.ChatOpenAI(
                base_url=base, api_key=key, model="gyre", max_retries=0
            ).bind_tools([multiply])
            history = [
                messages_mod.SystemMessage("You multiply with the tool."),
                messages_mod.HumanMessage("What is 6*7*2?"),
            ]
            for _ in range(5):
                ai = llm.invoke(history)
                history.append(ai)
                if not ai.tool_calls:
                    return ai.content
                for tc in ai.tool_calls:
                    history.append(
                        messages_mod.ToolMessage(
                            str(multiply.invoke(tc["args"])), tool_call_id=tc["id"]
                        )
                    )
            raise AssertionError("the agent did not finish")

        answer = await anyio.to_thread.run_sync(run_agent)
    assert answer == "The answer is 84."
    calls = proxy.calls("lc", full=True)
    assert len(calls) == 3
    for prev, call in zip(calls, calls[1:]):
        n = len(prev.prompt_ids) + len(prev.completion_ids)
        assert call.parent_call_id == prev.call_id
        # LangChain keeps no reasoning_content: healed (gyre.tito.heal), never re-tokenized.
        assert call.divergence is None
        assert call.prompt_ids[:n] == prev.prompt_ids + prev.completion_ids
    assert [c.completion_ids for c in calls] == [r.token_ids for r in replies]
    assert calls[1].heals == ("reasoning_dropped",)
    assert "first 6*7" in proxy.text.decode(calls[1].prompt_ids)  # the sampled reasoning, kept
    assert calls[2].heals == ()  # the second tool call round-trips exactly
