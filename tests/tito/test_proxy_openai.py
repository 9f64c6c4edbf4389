"""The official `openai` SDK drives a 20-turn tool-using conversation through the proxy (TITO)."""

from __future__ import annotations

import json

import anyio
import openai
import pytest

from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from tests.tito.conftest import SnapshotEngine, encode, make_proxy, serving

pytestmark = pytest.mark.anyio

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
]
TURNS = 20


def script(tok) -> list[ScriptedReply]:
    """20 replies: 19 tool calls (with reasoning, non-ASCII, some split non-canonically), then
    text."""
    eos = tok.eos_token_id
    replies = []
    for k in range(TURNS - 1):
        think = f"<think>step {k}: add ünïcode 字{k}</think>\n"
        call = f'<tool_call>{{"name": "add", "arguments": {{"a": {k}, "b": {k + 1}}}}}</tool_call>'
        ids = encode(tok, think)
        if k % 3 == 0:  # a non-canonical split of the call text: one token per byte run (B01 style)
            ids += [i for ch in call for i in encode(tok, ch)]
        else:
            ids += encode(tok, call)
        ids.append(eos)
        replies.append(
            ScriptedReply(
                token_ids=ids, logprobs=[-0.01 * (k + 1) - 0.001 * j for j in range(len(ids))]
            )
        )
    final = encode(tok, "The sum is done. Ünïcode ✓") + [eos]
    replies.append(ScriptedReply(token_ids=final, logprobs=[-0.2] * len(final)))
    return replies


def check_tito(tok, engine: ScriptedEngine, calls, replies, tools=TOOLS) -> None:
    """Every call extends the previous one token for token; completions are the engine's."""
    assert len(calls) == TURNS
    for k, call in enumerate(calls):
        assert call.completion_ids == replies[k].token_ids
        assert call.logprobs == replies[k].logprobs
        assert len(call.versions) == len(call.completion_ids)
        assert call.prompt_ids == engine.prompts_seen[k]  # what the engine ran on
        assert call.divergence is None
        if k:
            prev = calls[k - 1]
            n = len(prev.prompt_ids) + len(prev.completion_ids)
            assert call.parent_call_id == prev.call_id
            assert call.prompt_ids[:n] == prev.prompt_ids + prev.completion_ids
            assert len(call.prompt_ids) > n


def tool_result(call) -> str:
    args = json.loads(call.function.arguments)
    return str(args["a"] + args["b"])


async def test_twenty_turns_async_sdk(tok, anyio_backend):
    replies = script(tok)
    engine = SnapshotEngine(replies, eos_token_id=tok.eos_token_id)
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("ex-async")
    async with serving(proxy) as base_url:
        client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0)
        messages: list = [
            {"role": "system", "content": "You add numbers."},
            {"role": "user", "content": "Add things."},
        ]
        texts = []
        for k in range(TURNS):
            r = await client.chat.completions.create(
                model="gyre", messages=messages, tools=TOOLS, seed=k
            )
            msg = r.choices[0].message
            texts.append(
                tok.apply_chat_template(
                    [
                        m if isinstance(m, dict) else m.model_dump(exclude_none=True)
                        for m in messages
                    ],
                    tools=TOOLS,
                    tokenize=False,
                    add_generation_prompt=True,
                )
            )
            messages.append(msg)  # the SDK's own message object, sent back as is
            if msg.tool_calls:
                assert r.choices[0].finish_reason == "tool_calls"
                assert msg.reasoning_content == f"step {k}: add ünïcode 字{k}"
                assert json.loads(msg.tool_calls[0].function.arguments) == {"a": k, "b": k + 1}
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": msg.tool_calls[0].id,
                        "content": tool_result(msg.tool_calls[0]),
                    }
                )
            else:
                assert msg.content == "The sum is done. Ünïcode ✓"
        await client.close()
    calls = proxy.calls("ex-async", full=True)
    check_tito(tok, engine, calls, replies)
    # The recorded prompt is exactly the chat template's text of the messages sent.
    for call, text in zip(calls, texts):
        assert proxy.text.decode(call.prompt_ids) == text
    stats = proxy.statistics()
    assert stats.render_check_failures == 0 and stats.divergences == 0
    # Memory is O(history), not O(history x calls): the whole chain holds one prompt list.
    nodes = proxy.sessions.get("ex-async").render.nodes
    assert len({id(n.prompt_ref) for n in nodes}) == 1 and len(nodes[0].prompt_ref) == len(
        calls[-1].prompt_ids
    )
    summary = await proxy.close("ex-async")
    assert summary.num_calls == TURNS and not summary.truncated


async def test_twenty_turns_sync_sdk_in_thread(tok, anyio_backend):
    replies = script(tok)
    engine = SnapshotEngine(replies, eos_token_id=tok.eos_token_id)
    proxy = make_proxy(tok, engine, render_check_every=0)  # the production setting: check once
    key = proxy.mint_key("ex-sync")
    async with serving(proxy) as base_url:

        def agent() -> None:
            client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
            messages: list = [
                {"role": "system", "content": "You add numbers."},
                {"role": "user", "content": "Add."},
            ]
            for _ in range(TURNS):
                msg = (
                    client.chat.completions.create(model="gyre", messages=messages, tools=TOOLS)
                    .choices[0]
                    .message
                )
                messages.append(msg.model_dump(exclude_none=True))
                for tc in msg.tool_calls or ():
                    messages.append(
                        {"role": "tool", "tool_call_id": tc.id, "content": tool_result(tc)}
                    )
            client.close()

        await anyio.to_thread.run_sync(agent)
    check_tito(tok, engine, proxy.calls("ex-sync", full=True), replies)
    stats = proxy.statistics()
    assert stats.rendered_fast == TURNS - 2  # call 1 has no parent; call 2 is cross-checked in full
    assert stats.render_check_failures == 0


async def test_twenty_turns_streaming_sdk(tok, anyio_backend):
    replies = script(tok)
    engine = SnapshotEngine(replies, eos_token_id=tok.eos_token_id)
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("ex-stream")
    async with serving(proxy) as base_url:
        client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0)
        messages: list = [
            {"role": "system", "content": "You add numbers."},
            {"role": "user", "content": "Add."},
        ]
        for k in range(TURNS):
            stream = await client.chat.completions.create(
                model="gyre",
                messages=messages,
                tools=TOOLS,
                stream=True,
                logprobs=True,
                stream_options={"include_usage": True},
            )
            content, reasoning, tool_calls, token_ids, lps, usage = "", "", {}, [], [], None
            async for chunk in stream:
                if chunk.usage is not None:
                    usage = chunk.usage
                for choice in chunk.choices:
                    d = choice.delta
                    content += d.content or ""
                    reasoning += (d.model_extra or {}).get("reasoning_content") or ""
                    for tc in d.tool_calls or ():
                        slot = tool_calls.setdefault(
                            tc.index,
                            {
                                "id": tc.id,
                                "type": "function",
                                "function": {"name": "", "arguments": ""},
                            },
                        )
                        slot["function"]["name"] += tc.function.name or ""
                        slot["function"]["arguments"] += tc.function.arguments or ""
                    token_ids += choice.model_extra["token_ids"]
                    lps += [e.logprob for e in (choice.logprobs.content if choice.logprobs else [])]
            assert token_ids == replies[k].token_ids and lps == replies[k].logprobs
            assert usage.completion_tokens == len(token_ids)
            msg = {"role": "assistant", "content": content or None}
            if reasoning:
                msg["reasoning_content"] = reasoning
            if tool_calls:
                msg["tool_calls"] = [tool_calls[i] for i in sorted(tool_calls)]
            messages.append(msg)
            for tc in msg.get("tool_calls", ()):
                args = json.loads(tc["function"]["arguments"])
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": tc["id"],
                        "content": str(args["a"] + args["b"]),
                    }
                )
        await client.close()
    check_tito(tok, engine, proxy.calls("ex-stream", full=True), replies)
