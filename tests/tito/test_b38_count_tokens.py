"""Field case B38: Claude Code's `POST /v1/messages/count_tokens` (`?beta=true`) was a 404.

It answers `{"input_tokens": N}`, N exactly the length of the prompt `/v1/messages` renders for a
request of the same conversation (the served model's own template, the execution's parent and
path), with no engine call, nothing recorded and the execution's render state as it was."""

from __future__ import annotations

import dataclasses
import json

import anyio
import httpx
import pytest

from gyre.config import ProxyConfig
from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from gyre.tito.proxy import TitoProxy
from tests.tito.conftest import asgi_post, encode, serving

anthropic = pytest.importorskip("anthropic", reason="anthropic is in the [test] extra")

pytestmark = pytest.mark.anyio

SYSTEM = [
    {
        "type": "text",
        "text": "You answer with the weather tool.",
        "cache_control": {"type": "ephemeral"},
    }
]
TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather of a city.",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
        "cache_control": {"type": "ephemeral"},
    }
]
SCRIPT = [
    '<think>need the weather</think>\n<tool_call>{"name": "get_weather", "arguments": '
    '{"city":"Paris"}}</tool_call>',
    '<tool_call>{"name": "get_weather", "arguments": {"city":"Oslo"}}</tool_call>',
    "Sunny in Paris, rain in Oslo.",
]
RESULTS = ["sunny, 21 C", "rain, 9 C"]


class _Counted:
    """`engine_for` that counts how often the proxy asked for an engine (a router pins the
    execution to a cell when asked)."""

    def __init__(self, engine: ScriptedEngine) -> None:
        self.engine, self.asked = engine, 0

    def __call__(self, execution_id: str) -> ScriptedEngine:
        self.asked += 1
        return self.engine


def _proxy(tok, check_every: int) -> tuple[TitoProxy, _Counted, list[list[int]]]:
    eos = tok.eos_token_id
    ids = [encode(tok, s) + [eos] for s in SCRIPT]
    engine = ScriptedEngine([ScriptedReply(token_ids=i) for i in ids], eos_token_id=eos)
    engine_for = _Counted(engine)
    proxy = TitoProxy(
        tokenizer=tok,
        engine_for=engine_for,
        config=ProxyConfig(render_check_every=check_every),
    )
    return proxy, engine_for, ids


def _render_state(proxy: TitoProxy, execution: str) -> tuple:
    """Everything a count must leave as it was: the nodes and their token lists, the anchor
    check's state, the renderer's statistics, the records."""
    ex = proxy.sessions.get(execution)
    assert ex is not None
    nodes = [
        (n.call_id, n.prompt_len, len(n.prompt_ref), id(n.prompt_ref), n.parent)
        for n in ex.render.nodes
    ]
    render = (ex.render.anchor_ok, ex.render.fast_since_check)
    stats = dataclasses.asdict(proxy.renderer.stats)
    return nodes, render, stats, proxy.statistics().calls_recorded, len(ex.calls())


def _reference_prompt(tok) -> list[int]:
    """The first call's prompt by the tokenizer's own template (chat shape of the body)."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t["description"],
                "parameters": t["input_schema"],
            },
        }
        for t in TOOLS
    ]
    messages = [
        {"role": "system", "content": SYSTEM[0]["text"]},
        {"role": "user", "content": "Weather in Paris and Oslo?"},
    ]
    text = tok.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )
    return encode(tok, text)


@pytest.mark.parametrize("check_every", [1, 0], ids=["checked", "fast_path"])
async def test_b38_count_tokens_is_the_prompt_messages_renders(tok, anyio_backend, check_every):
    """Three turns of a tool conversation through the official SDK: before each `create`, the
    same conversation's `count_tokens` (plain and `?beta=true`) is exactly the prompt length the
    call then records, whether the render is checked or on the unchecked fast path (turn 3 with
    `render_check_every = 0`). A count asks for no engine and changes nothing."""
    proxy, engine_for, ids = _proxy(tok, check_every)
    key = proxy.mint_key("ct")
    counts: list[tuple[int, int]] = []
    states: list[tuple[tuple, tuple]] = []
    async with serving(proxy) as base:

        def run() -> None:
            client = anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key=key)
            history: list = [{"role": "user", "content": "Weather in Paris and Oslo?"}]
            for turn in range(3):
                conv = dict(model="gyre", system=SYSTEM, tools=TOOLS, messages=history)
                asked = engine_for.asked
                before = _render_state(proxy, "ct")
                plain = client.messages.count_tokens(**conv)
                beta = client.beta.messages.count_tokens(**conv)
                states.append((before, _render_state(proxy, "ct")))
                assert engine_for.asked == asked  # no engine asked for, so no cell pinned
                counts.append((plain.input_tokens, beta.input_tokens))
                reply = client.messages.create(max_tokens=64, **conv)
                history = history + [{"role": "assistant", "content": reply.content}]
                if turn < 2:
                    tool_use = reply.content[-1]
                    result = {
                        "type": "tool_result",
                        "tool_use_id": tool_use.id,
                        "content": RESULTS[turn],
                    }
                    history.append({"role": "user", "content": [result]})

        await anyio.to_thread.run_sync(run)
    calls = proxy.calls("ct", full=True)
    assert [c.completion_ids for c in calls] == ids
    assert counts == [(len(c.prompt_ids), len(c.prompt_ids)) for c in calls]
    assert calls[0].prompt_ids == _reference_prompt(tok)  # the served model's own template
    for before, after in states:
        assert before == after
    # One path: every call extends the one before, and no count left a node behind.
    assert [c.parent_call_id for c in calls] == [None, calls[0].call_id, calls[1].call_id]
    assert all(c.divergence is None for c in calls)
    stats = proxy.renderer.stats
    if check_every == 0:
        assert stats.fast == 1  # turn 3 took the unchecked fast path, and so did its count
    assert proxy.statistics().requests_total == 9


async def test_b38_beta_query_and_errors_in_anthropic_shape(tok, anyio_backend):
    """`?beta=true` on the raw route; a body the count schema refuses (`max_tokens`, which
    count_tokens does not take; no `messages`; an assistant turn last; an unknown model; a
    bad key) is an error in Anthropic's shape, with nothing recorded or rendered."""
    proxy, engine_for, _ = _proxy(tok, 1)
    key = proxy.mint_key("ce")
    body = {"model": "gyre", "messages": [{"role": "user", "content": "hi"}]}
    async with serving(proxy) as base:
        url = base + "/messages/count_tokens?beta=true"
        async with httpx.AsyncClient() as client:
            ok = await client.post(url, json=body, headers={"x-api-key": key})
            assert ok.status_code == 200 and ok.json() == {
                "input_tokens": len(
                    encode(
                        tok,
                        tok.apply_chat_template(
                            [{"role": "user", "content": "hi"}],
                            tokenize=False,
                            add_generation_prompt=True,
                        ),
                    )
                )
            }
            refused = await client.post(url, json=body, headers={"x-api-key": "nope"})
            assert refused.status_code == 401
            assert refused.json()["type"] == "error"
    for bad, named in [
        ({**body, "max_tokens": 16}, "max_tokens"),
        ({"model": "gyre"}, "messages"),
        ({**body, "messages": [{"role": "assistant", "content": "x"}]}, "last message"),
        ({**body, "stream": True}, "stream"),
    ]:
        status, raw = await asgi_post(proxy, "/v1/messages/count_tokens", key, bad)
        err = json.loads(raw)
        assert status == 400 and err["type"] == "error", raw
        assert err["error"]["type"] == "invalid_request_error"
        assert named in err["error"]["message"], err
    status, raw = await asgi_post(
        proxy, "/v1/messages/count_tokens", key, {**body, "model": "claude-x"}
    )
    assert status == 404 and json.loads(raw)["error"]["type"] == "not_found_error"
    assert proxy.calls("ce") == [] and engine_for.asked == 0
    assert proxy.sessions.get("ce").render.nodes == []
