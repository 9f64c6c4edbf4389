"""The Anthropic Messages API on the proxy, driven by the official `anthropic` SDK: tool turns,
thinking blocks, streaming events and errors, recorded token for token on the chat path."""

from __future__ import annotations

import json

import anyio
import httpx
import pytest

from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from gyre.tito.messages_api import MessagesRequest, to_chat
from gyre.tito.sessions import Execution
from tests.tito.conftest import asgi_post, encode, make_proxy, serving

anthropic = pytest.importorskip("anthropic", reason="anthropic is in the [test] extra")

pytestmark = pytest.mark.anyio

SYSTEM = "You answer with the weather tool."
TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather of a city.",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]
# Compact argument JSON: json.dumps(tool_use.input) would re-serialise it as {"city": "Paris"},
# so only the proxy's own record of the argument text keeps the echo exact.
SCRIPT = [
    '<think>need the weather</think>\n<tool_call>{"name": "get_weather", "arguments": '
    '{"city":"Paris"}}</tool_call>',
    "It is sunny in Paris.",
]


def _chat_reference(tok, tool_id: str) -> str:
    """The prompt text of the second call, rendered by the tokenizer's own template from the
    chat conversation the Messages history means."""
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "need the weather",
            "tool_calls": [
                {
                    "id": tool_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": tool_id, "content": "sunny, 21 C"},
    ]
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
    return tok.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )


def _scripted(tok) -> tuple[ScriptedEngine, list[list[int]]]:
    eos = tok.eos_token_id
    ids = [encode(tok, s) + [eos] for s in SCRIPT]
    return ScriptedEngine([ScriptedReply(token_ids=i) for i in ids], eos_token_id=eos), ids


def _check_one_path(proxy, tok, execution: str, ids: list[list[int]]) -> None:
    """Two calls, recorded with the engine's tokens; the second extends the first exactly."""
    first, second = proxy.calls(execution, full=True)
    assert [first.completion_ids, second.completion_ids] == ids
    assert second.parent_call_id == first.call_id and second.divergence is None
    # Exact without history healing (gyre.tito.heal), which would hide a re-serialised echo.
    assert getattr(second, "heals", ()) == ()
    assert second.prompt_ids[: len(first.prompt_ids) + len(ids[0])] == first.prompt_ids + ids[0]
    tool_id = f"call_{execution}_{first.call_id}_0"
    assert tok.decode(second.prompt_ids) == _chat_reference(tok, tool_id)
    assert proxy.statistics().divergences == 0


@pytest.mark.parametrize("echo", ["sdk_objects", "model_dump"])
async def test_create_tool_use_then_tool_result_is_recorded_exactly(tok, anyio_backend, echo):
    """The reply's blocks echoed as the SDK's objects, or as `model_dump()` dicts (every field,
    `tool_use.caller: null` and `text.citations: null` included), extend the recorded path."""
    engine, ids = _scripted(tok)
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("am")
    async with serving(proxy) as base:

        def run() -> list:
            client = anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key=key)
            history = [{"role": "user", "content": "Weather in Paris?"}]
            out = []
            for result in (None, "sunny, 21 C"):
                if result is not None:
                    tool_use = out[-1].content[-1]
                    history += [
                        {
                            "role": "assistant",
                            "content": out[-1].content
                            if echo == "sdk_objects"
                            else [b.model_dump() for b in out[-1].content],
                        },
                        {
                            "role": "user",
                            "content": [
                                {
                                    "type": "tool_result",
                                    "tool_use_id": tool_use.id,
                                    "content": result,
                                }
                            ],
                        },
                    ]
                out.append(
                    client.messages.create(
                        model="gyre", max_tokens=200, system=SYSTEM, tools=TOOLS, messages=history
                    )
                )
            return out

        first, second = await anyio.to_thread.run_sync(run)
    assert [b.type for b in first.content] == ["thinking", "tool_use"]
    assert first.content[0].thinking == "need the weather"
    assert (first.content[1].name, first.content[1].input) == ("get_weather", {"city": "Paris"})
    assert (first.stop_reason, first.stop_sequence) == ("tool_use", None)
    assert [b.type for b in second.content] == ["text"]
    assert second.content[0].text == "It is sunny in Paris."
    assert second.stop_reason == "end_turn"
    calls = proxy.calls("am", full=True)
    for msg, call, want in zip((first, second), calls, ids):
        assert msg.model_extra["gyre"]["token_ids"] == want
        assert msg.model_extra["gyre"]["call_id"] == call.call_id
        assert msg.usage.input_tokens == len(call.prompt_ids)
        assert msg.usage.output_tokens == len(want)
    _check_one_path(proxy, tok, "am", ids)


async def test_stream_tool_use_then_tool_result_is_recorded_exactly(tok, anyio_backend):
    engine, ids = _scripted(tok)
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("ams")
    async with serving(proxy) as base:

        def run() -> list:
            client = anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key=key)
            history = [{"role": "user", "content": "Weather in Paris?"}]
            out = []
            for turn in range(2):
                if turn:
                    tool_use = out[-1][0].content[-1]
                    history += [
                        {"role": "assistant", "content": out[-1][0].content},
                        {
                            "role": "user",
                            "content": [
                                {
                                    "type": "tool_result",
                                    "tool_use_id": tool_use.id,
                                    "content": [{"type": "text", "text": "sunny, 21 C"}],
                                }
                            ],
                        },
                    ]
                with client.messages.stream(
                    model="gyre", max_tokens=200, system=SYSTEM, tools=TOOLS, messages=history
                ) as stream:
                    events = list(stream)
                    out.append((stream.get_final_message(), events))
            return out

        (first, events1), (second, events2) = await anyio.to_thread.run_sync(run)
    starts = [e.content_block.type for e in events1 if e.type == "content_block_start"]
    assert starts == ["thinking", "tool_use"]
    thinking = "".join(
        e.delta.thinking
        for e in events1
        if e.type == "content_block_delta" and e.delta.type == "thinking_delta"
    )
    assert thinking == "need the weather"
    json_deltas = [
        e.delta.partial_json
        for e in events1
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert json_deltas == ['{"city":"Paris"}']  # the model's own argument text
    assert (first.content[1].input, first.stop_reason) == ({"city": "Paris"}, "tool_use")
    assert second.content[0].text == "It is sunny in Paris." and second.stop_reason == "end_turn"
    for events, want in ((events1, ids[0]), (events2, ids[1])):
        assert events[0].type == "message_start" and events[-1].type == "message_stop"
        (delta,) = [e for e in events if e.type == "message_delta"]
        assert delta.model_extra["gyre"]["token_ids"] == want
        assert delta.usage.output_tokens == len(want)
    _check_one_path(proxy, tok, "ams", ids)


async def test_stream_wire_events(tok, anyio_backend):
    """The SSE framing itself (the SDK hides `ping`): `event: <type>` names each data's type, in
    the protocol's order, with a text block between message_start and message_delta."""
    eos = tok.eos_token_id
    engine = ScriptedEngine([ScriptedReply(token_ids=encode(tok, "Hi there.") + [eos])])
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("raw")
    async with serving(proxy) as base:
        async with httpx.AsyncClient() as client:
            r = await client.post(
                base + "/messages",
                headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
                json={
                    "model": "gyre",
                    "max_tokens": 50,
                    "stream": True,
                    "messages": [{"role": "user", "content": "Hello"}],
                },
            )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in r.text.split("\n\n") if f]
    kinds = []
    for frame in frames:
        event, data = frame.split("\n")
        kind = event.removeprefix("event: ")
        assert json.loads(data.removeprefix("data: "))["type"] == kind
        kinds.append(kind)
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[3:-3]) == {"content_block_delta"}
    text = "".join(
        json.loads(f.split("\n")[1][6:])["delta"]["text"]
        for f in frames
        if f.startswith("event: content_block_delta")
    )
    assert text == "Hi there."


async def test_stop_sequence_and_max_tokens(tok, anyio_backend):
    eos = tok.eos_token_id
    engine = ScriptedEngine(
        [
            ScriptedReply(token_ids=encode(tok, "one two END three") + [eos]),
            ScriptedReply(token_ids=encode(tok, "a long answer that goes on") + [eos]),
        ]
    )
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("stop")
    async with serving(proxy) as base:

        def run():
            client = anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key=key)
            msgs = [{"role": "user", "content": "Count."}]
            a = client.messages.create(
                model="gyre", max_tokens=50, stop_sequences=["XYZ", "END"], messages=msgs
            )
            b = client.messages.create(model="gyre", max_tokens=3, messages=msgs)
            return a, b

        a, b = await anyio.to_thread.run_sync(run)
    assert (a.stop_reason, a.stop_sequence, a.content[0].text) == (
        "stop_sequence",
        "END",
        "one two ",
    )
    assert (b.stop_reason, b.usage.output_tokens) == ("max_tokens", 3)
    assert proxy.calls("stop")[1].completion_ids == encode(tok, "a long answer that goes on")[:3]


BAD = {
    "missing max_tokens": ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    "unknown block type": (
        {"messages": [{"role": "user", "content": [{"type": "audio", "data": "x"}]}]},
        "'audio' is not supported",
    ),
    "image block": (
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image", "source": {"type": "base64", "data": "AA=="}}],
                }
            ]
        },
        "image blocks are not supported",
    ),
    "orphan tool_result": (
        {
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "no tool here"},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "y"}],
                },
            ]
        },
        "answers no tool_use",
    ),
    "unanswered tool_use": (
        {
            "messages": [
                {"role": "user", "content": "x"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
                },
                {"role": "user", "content": "go on"},
            ]
        },
        "no tool_result",
    ),
    "unknown field": (
        {"messages": [{"role": "user", "content": "x"}], "container": "container_1"},
        "container is not supported",
    ),
    "redacted thinking": (
        {
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "Zm9v"}]},
                {"role": "user", "content": "y"},
            ]
        },
        "redacted_thinking",
    ),
    "assistant prefill": (
        {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "A"}]},
        "prefill",
    ),
    "thinking disabled without a template switch": (
        {"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "disabled"}},
        "enable_thinking",
    ),
    "thinking budget over max_tokens": (
        {
            "messages": [{"role": "user", "content": "x"}],
            "thinking": {"type": "enabled", "budget_tokens": 4096},
        },
        "budget_tokens",
    ),
    "temperature above 1": (
        {"messages": [{"role": "user", "content": "x"}], "temperature": 1.5},
        "temperature",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
async def test_bad_requests_get_a_400_in_anthropic_shape(tok, case, anyio_backend):
    body, needle = BAD[case]
    body = {
        "model": "gyre",
        **({"max_tokens": 100} if case != "missing max_tokens" else {}),
        **body,
    }
    proxy = make_proxy(tok, ScriptedEngine())
    key = proxy.mint_key("bad")
    status, raw = await asgi_post(proxy, "/v1/messages", key, body)
    out = json.loads(raw)
    assert status == 400, out
    assert out["type"] == "error" and out["error"]["type"] == "invalid_request_error"
    assert needle in out["error"]["message"]
    assert proxy.calls("bad", full=True) == []


async def test_auth_and_model_errors_through_the_sdk(tok, anyio_backend):
    proxy = make_proxy(tok, ScriptedEngine())
    key = proxy.mint_key("auth")
    async with serving(proxy) as base:

        def run():
            kwargs = dict(max_tokens=10, messages=[{"role": "user", "content": "x"}])
            root = base.removesuffix("/v1")
            errors = []
            for api_key, model in (("wrong", "gyre"), (key, "claude-sonnet-4-5")):
                client = anthropic.Anthropic(base_url=root, api_key=api_key, max_retries=0)
                try:
                    client.messages.create(model=model, **kwargs)
                except anthropic.APIStatusError as exc:
                    errors.append(exc)
            return errors

        bad_key, bad_model = await anyio.to_thread.run_sync(run)
    assert isinstance(bad_key, anthropic.AuthenticationError)
    assert bad_key.body["error"]["type"] == "authentication_error"
    assert isinstance(bad_model, anthropic.NotFoundError)
    assert bad_model.body == {
        "type": "error",
        "error": {"type": "not_found_error", "message": bad_model.body["error"]["message"]},
    }
    assert "claude-sonnet-4-5" in bad_model.body["error"]["message"]


def _to_chat(**body):
    import msgspec

    req = msgspec.json.decode(
        json.dumps({"model": "gyre", "max_tokens": 2000, **body}), type=MessagesRequest
    )
    return to_chat(req, Execution(execution_id="x", key="k"), thinking_switch=True)


def test_to_chat_turns_tools_and_choices():
    chat = _to_chat(
        system=[{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
        tools=TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        thinking={"type": "enabled", "budget_tokens": 1024},
        stop_sequences=["##"],
        messages=[
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "r", "signature": "sig"},
                    {"type": "text", "text": "calling"},
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "X"}},
                    {"type": "tool_use", "id": "t2", "name": "get_weather", "input": {"city": "Y"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "content": "down",
                        "is_error": True,
                    },
                    {"type": "text", "text": "and?"},
                ],
            },
        ],
    )
    roles = [(m.role, m.content, m.tool_call_id) for m in chat.messages]
    assert roles[0][0] == "system" and [p.text for p in roles[0][1]] == ["A", "B"]
    assert roles[1:] == [
        ("user", "q", None),
        ("assistant", "calling", None),
        ("tool", "ok", "t1"),
        ("tool", "Error: down", "t2"),
        ("user", "and?", None),
    ]
    assistant = chat.messages[2]
    assert assistant.reasoning_content == "r"
    assert [(c.id, c.function.name, c.function.arguments) for c in assistant.tool_calls] == [
        ("t1", "get_weather", '{"city": "X"}'),
        ("t2", "get_weather", '{"city": "Y"}'),
    ]
    assert chat.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather of a city.",
                "parameters": TOOLS[0]["input_schema"],
            },
        }
    ]
    assert (chat.tool_choice, chat.parallel_tool_calls) == ("required", False)
    assert chat.chat_template_kwargs == {"enable_thinking": True}
    assert (chat.max_tokens, chat.stop) == (2000, ["##"])
    named = _to_chat(
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "q"}],
    )
    assert named.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert named.parallel_tool_calls is None
    off = _to_chat(thinking={"type": "disabled"}, messages=[{"role": "user", "content": "q"}])
    assert off.chat_template_kwargs == {"enable_thinking": False}


@pytest.mark.slow
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # one backend: the shared cell is the cost
async def test_stream_with_a_tool_against_vllm(vllm_engine, anyio_backend):
    """Real vLLM: `tool_choice: any` (enforced by the reply grammar) streams a tool_use block, the
    tool_result turn streams on; each call's completion IDs are the streamed `gyre.token_ids`."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(vllm_engine.tokenizer_dir))
    proxy = make_proxy(tok, vllm_engine)
    key = proxy.mint_key("vllm-messages")
    schema = {"type": "object", "properties": {}, "additionalProperties": False}
    tools = [{"name": "ping", "input_schema": schema}]
    history: list = [{"role": "user", "content": "Call ping."}]
    streamed = []
    async with serving(proxy) as base:
        client = anthropic.AsyncAnthropic(
            base_url=base.removesuffix("/v1"), api_key=key, max_retries=0, timeout=300
        )
        for turn in range(2):
            # one call: with parallel calls allowed the untrained model chains calls until
            # max_tokens (the grammar permits it), and the reply ends `max_tokens`
            choice = (
                {"type": "any", "disable_parallel_tool_use": True}
                if turn == 0
                else {"type": "none"}
            )
            async with client.messages.stream(
                model="gyre",
                max_tokens=64,
                tools=tools,
                tool_choice=choice,
                messages=history,
            ) as stream:
                events = [e async for e in stream]
                final = await stream.get_final_message()
            (delta,) = [e for e in events if e.type == "message_delta"]
            streamed.append(delta.model_extra["gyre"]["token_ids"])
            if turn == 0:
                uses = [b for b in final.content if b.type == "tool_use"]
                assert final.stop_reason == "tool_use", final
                assert uses and uses[0].name == "ping"
                assert uses[0].input == {}
                history += [
                    {"role": "assistant", "content": final.content},
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": u.id, "content": "pong"}
                            for u in uses
                        ],
                    },
                ]
        await client.close()
    first, second = proxy.calls("vllm-messages", full=True)
    assert [first.completion_ids, second.completion_ids] == streamed
    known = first.prompt_ids + first.completion_ids
    assert second.parent_call_id == first.call_id
    if second.divergence is None:
        assert second.prompt_ids[: len(known)] == known
    else:  # sampled text that does not survive decode and re-render: flagged, never silent
        index = second.divergence.index
        assert second.prompt_ids[:index] == known[:index]
