"""`POST /v1/responses` through the proxy with the official openai SDK: whole and streamed
responses, reasoning and function tools, `previous_response_id` chains, refusals, and the
recording (prompt of call k+1 = prompt + completion of call k, token for token)."""

from __future__ import annotations

import json

import anyio
import pytest

from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from tests.tito.conftest import asgi_post, encode, make_proxy, serving

openai = pytest.importorskip("openai", reason="openai is a dependency of the [test] extra")
from openai.types.responses import Response, ResponseStreamEvent  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402

pytestmark = pytest.mark.anyio

ADD_TOOL = {
    "type": "function",
    "name": "add",
    "description": "Add two integers.",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}
TURN1 = (
    '<think>add them</think>\n<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
)
TURN2 = "<think>done</think>\nThe sum is 5."
EVENTS = TypeAdapter(ResponseStreamEvent)


def scripted(tok, *texts: str) -> tuple[ScriptedEngine, list[list[int]]]:
    eos = tok.eos_token_id
    ids = [encode(tok, t) + [eos] for t in texts]
    return ScriptedEngine([ScriptedReply(token_ids=i) for i in ids], eos_token_id=eos), ids


def check_extends(calls) -> None:
    """Each call's prompt starts with its parent's prompt + completion (no branch)."""
    for prev, call in zip(calls, calls[1:]):
        assert call.parent_call_id == prev.call_id
        assert call.divergence is None
        known = prev.prompt_ids + prev.completion_ids
        assert call.prompt_ids[: len(known)] == known


def strict(body: dict) -> Response:
    """The SDK's own model, validated (not the lenient construct the client uses)."""
    return Response.model_validate(body)


async def two_turns(proxy, key: str, base: str, *, chain: bool) -> list[Response]:
    client = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0)
    first = await client.responses.create(
        model="gyre", instructions="Use the tool.", input="What is 2+3?", tools=[ADD_TOOL]
    )
    call = first.output[-1]
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "5"}
    if chain:
        second = await client.responses.create(
            model="gyre",
            instructions="Use the tool.",
            previous_response_id=first.id,
            input=[result],
            tools=[ADD_TOOL],
        )
    else:
        items = [{"role": "user", "content": "What is 2+3?"}]
        items += [o.model_dump(exclude_none=True) for o in first.output] + [result]
        second = await client.responses.create(
            model="gyre", instructions="Use the tool.", input=items, tools=[ADD_TOOL]
        )
    await client.close()
    return [first, second]


@pytest.mark.parametrize("chain", [False, True], ids=["resend", "previous_response_id"])
async def test_create_with_reasoning_and_a_tool_is_recorded_exactly(tok, anyio_backend, chain):
    engine, ids = scripted(tok, TURN1, TURN2)
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("r")
    async with serving(proxy) as base:
        first, second = await two_turns(proxy, key, base, chain=chain)
    assert [o.type for o in first.output] == ["reasoning", "function_call"]
    assert first.output[0].content[0].text == "add them"
    fc = first.output[1]
    assert (fc.name, json.loads(fc.arguments)) == ("add", {"a": 2, "b": 3})
    assert fc.arguments == '{"a": 2, "b": 3}'  # the model's exact text
    assert first.status == "completed" and first.model_extra["token_ids"] == ids[0]
    assert [o.type for o in second.output] == ["reasoning", "message"]
    assert second.output_text == "The sum is 5."
    calls = proxy.calls("r", full=True)
    assert [c.completion_ids for c in calls] == ids
    check_extends(calls)
    # usage: the recorded prompt and completion; reasoning = tokens up to the end of "add them"
    assert first.usage.input_tokens == len(calls[0].prompt_ids)
    assert first.usage.output_tokens == len(ids[0])
    think = encode(tok, "<think>add them")
    assert first.usage.output_tokens_details.reasoning_tokens == len(think)
    # the prompt the template renders for the echoed history, by hand
    text = proxy.text.decode(calls[1].prompt_ids)
    assert text.endswith(
        TURN1 + "<|im_end|>\n<|im_start|>tool\n<tool_response>5</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert text.startswith("<|im_start|>system\nUse the tool.\n\n# Tools")


async def test_whole_body_parses_with_the_sdk_types(tok, anyio_backend):
    engine, ids = scripted(tok, TURN1)
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("b")
    status, raw = await asgi_post(
        proxy,
        "/v1/responses",
        key,
        {
            "model": "gyre",
            "input": [
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "2+3?"}],
                }
            ],
            "tools": [ADD_TOOL],
            "metadata": {"k": "v"},
            "include": ["message.output_text.logprobs"],
            "return_token_ids": True,
        },
    )
    assert status == 200, raw
    body = json.loads(raw)
    resp = strict(body)
    call = proxy.calls("b", full=True)[0]
    assert resp.id == "resp_b_c0" and resp.metadata == {"k": "v"}
    assert body["prompt_token_ids"] == call.prompt_ids and body["token_ids"] == ids[0]
    assert body["gyre"]["call_id"] == "c0"
    assert resp.usage.total_tokens == len(call.prompt_ids) + len(ids[0])


async def test_stream_events_and_recording(tok, anyio_backend):
    engine, ids = scripted(tok, TURN1, TURN2)
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("s")
    kinds: list[list[str]] = []
    finals: list[Response] = []
    async with serving(proxy) as base:
        client = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0)
        items: list = [{"role": "user", "content": "What is 2+3?"}]
        for _ in range(2):
            seen, text, seqs = [], "", []
            async with client.responses.stream(
                model="gyre", instructions="Use the tool.", input=items, tools=[ADD_TOOL]
            ) as stream:
                async for event in stream:
                    EVENTS.validate_python(event.model_dump())  # every event, strictly
                    seen.append(event.type)
                    seqs.append(event.sequence_number)
                    if event.type == "response.output_text.delta":
                        text += event.delta
                final = await stream.get_final_response()
            assert seqs == list(range(len(seqs)))
            kinds.append(seen)
            finals.append(final)
            items += [o.model_dump(exclude_none=True) for o in final.output]
            if final.output[-1].type == "function_call":
                items.append(
                    {
                        "type": "function_call_output",
                        "call_id": final.output[-1].call_id,
                        "output": "5",
                    }
                )
        await client.close()
    assert kinds[0][:2] == ["response.created", "response.in_progress"]
    assert kinds[0][-1] == "response.completed"
    for kind in (
        "response.reasoning_text.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ):
        assert kind in kinds[0]
    assert "response.output_text.delta" in kinds[1] and "response.content_part.added" in kinds[1]
    assert finals[1].output_text == "The sum is 5." and text == "The sum is 5."
    assert finals[0].output[1].arguments == '{"a": 2, "b": 3}'
    calls = proxy.calls("s", full=True)
    assert [c.completion_ids for c in calls] == ids
    check_extends(calls)


async def test_max_output_tokens_gives_incomplete(tok, anyio_backend):
    engine, ids = scripted(tok, "a long answer that goes on")
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("i")
    status, raw = await asgi_post(
        proxy, "/v1/responses", key, {"model": "gyre", "input": "hi", "max_output_tokens": 2}
    )
    resp = strict(json.loads(raw))
    assert status == 200
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage.output_tokens == 2 and proxy.calls("i")[0].completion_ids == ids[0][:2]


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        (
            {"previous_response_id": "resp_nope"},
            "previous_response_id",
            "previous_response_not_found",
        ),
        ({"input": [{"type": "web_search_call", "id": "x"}]}, "input[0]", "invalid_value"),
        ({"input": [{"role": ["user"], "content": "x"}]}, "input[0]", "invalid_value"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input[0].content[0]",
            "invalid_value",
        ),
        ({"conversation": "conv_1"}, "conversation", "unsupported_parameter"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]", "invalid_value"),
        ({"tools": [{"type": "function"}]}, "tools[0].name", "invalid_value"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": {"x": 1}}]}]},
            "input[0].content[0].text",
            "invalid_value",
        ),
        ({"tools": [{"type": "function", "name": 5}]}, "tools[0].name", "invalid_value"),
        ({"truncation": "auto"}, "truncation", "unsupported_value"),
        ({"reasoning": {"summary": "concise"}}, "reasoning.summary", "unsupported_value"),
        ({"include": ["file_search_call.results"]}, "include", "unsupported_value"),
        ({"max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
        ({"input": []}, "input", "invalid_value"),
    ],
)
async def test_refusals_are_400_and_record_nothing(tok, anyio_backend, body, param, code):
    engine, _ = scripted(tok, "x")
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("e")
    status, raw = await asgi_post(
        proxy, "/v1/responses", key, {"model": "gyre", "input": "hi", **body}
    )
    err = json.loads(raw)["error"]
    assert status == 400, raw
    assert (err["param"], err["code"]) == (param, code), err
    assert proxy.calls("e", full=True) == []


@pytest.mark.parametrize(
    "raw",
    [b"", b"{bad", b'{"model": "gyre", "input": "\xff"}', b'{"model": "gyre", "temperature": NaN}'],
    ids=["empty", "not_json", "not_utf8", "nan"],
)
async def test_a_body_that_is_not_json_is_400_and_records_nothing(tok, anyio_backend, raw):
    """Was a 500 with a traceback: only msgspec's ValidationError was caught."""
    engine, _ = scripted(tok, "x")
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("j")
    status, body = await asgi_post(proxy, "/v1/responses", key, raw)
    assert status == 400, body
    assert json.loads(body)["error"]["code"] == "invalid_json"
    assert proxy.calls("j", full=True) == [] and proxy.statistics().requests_refused == 1


async def test_chain_is_per_execution_and_dropped_at_close(tok, anyio_backend):
    engine, _ = scripted(tok, "one", "two")
    proxy = make_proxy(tok, engine)
    a, b = proxy.mint_key("a"), proxy.mint_key("b")
    status, raw = await asgi_post(proxy, "/v1/responses", a, {"model": "gyre", "input": "hi"})
    rid = json.loads(raw)["id"]
    status, raw = await asgi_post(
        proxy, "/v1/responses", b, {"model": "gyre", "input": "x", "previous_response_id": rid}
    )
    assert status == 400 and json.loads(raw)["error"]["code"] == "previous_response_not_found"
    assert "a" in proxy.responses_api._chains
    await proxy.close("a")
    assert "a" not in proxy.responses_api._chains


async def test_store_false_keeps_no_chain(tok, anyio_backend):
    engine, _ = scripted(tok, "one", "two")
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("n")
    _, raw = await asgi_post(
        proxy, "/v1/responses", key, {"model": "gyre", "input": "hi", "store": False}
    )
    rid = json.loads(raw)["id"]
    status, _ = await asgi_post(
        proxy, "/v1/responses", key, {"model": "gyre", "input": "x", "previous_response_id": rid}
    )
    assert status == 400


async def test_unknown_route_404_names_the_path(tok, anyio_backend):
    engine, _ = scripted(tok, "x")
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("u")
    status, raw = await asgi_post(proxy, "/v1/nothing/here", key, {})
    err = json.loads(raw)["error"]
    assert status == 404 and err["code"] == "unknown_route"
    assert "/v1/nothing/here" in err["message"] and "model" not in err["message"].split("(")[0]


async def test_langchain_use_responses_api(tok, anyio_backend):
    langchain_openai = pytest.importorskip("langchain_openai")
    engine, ids = scripted(tok, TURN1, TURN2)
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("lc")
    async with serving(proxy) as base:

        def run() -> tuple:
            from langchain_core.messages import HumanMessage, ToolMessage

            llm = langchain_openai.ChatOpenAI(
                base_url=base, api_key=key, model="gyre", max_retries=0, use_responses_api=True
            ).bind_tools([ADD_TOOL])
            history: list = [HumanMessage("What is 2+3?")]
            ai = llm.invoke(history)
            history += [ai, ToolMessage("5", tool_call_id=ai.tool_calls[0]["id"])]
            return ai, llm.invoke(history)

        ai, final = await anyio.to_thread.run_sync(run)
    assert ai.tool_calls[0]["name"] == "add" and ai.tool_calls[0]["args"] == {"a": 2, "b": 3}
    assert final.text == "The sum is 5."
    calls = proxy.calls("lc", full=True)
    assert [c.completion_ids for c in calls] == ids
    assert calls[1].parent_call_id == calls[0].call_id


@pytest.mark.slow
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # one vLLM cell start is enough
async def test_streamed_response_with_a_tool_against_vllm(vllm_engine, anyio_backend):
    """A real vLLM cell (the shared engine of the slow tier): a streamed Responses call with a
    tool offered is recorded with exactly the tokens and logprobs the final response reports."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(vllm_engine.tokenizer_dir))
    proxy = make_proxy(tok, vllm_engine)
    key = proxy.mint_key("v")
    async with serving(proxy) as base:
        client = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0, timeout=300)
        kinds, text = [], ""
        async with client.responses.stream(
            model="gyre",
            input="Add 2 and 3.",
            tools=[ADD_TOOL],
            max_output_tokens=24,
            temperature=1.0,
            include=["message.output_text.logprobs"],
        ) as stream:
            async for event in stream:
                EVENTS.validate_python(event.model_dump())
                kinds.append(event.type)
                if event.type == "response.output_text.delta":
                    text += event.delta
                final = getattr(event, "response", None)  # the last event's: completed or not
        await client.close()
    assert kinds[0] == "response.created" and kinds[-1] in (
        "response.completed",
        "response.incomplete",
    )
    (call,) = proxy.calls("v", full=True)
    assert final.model_extra["token_ids"] == call.completion_ids and call.completion_ids
    messages = [o for o in final.output if o.type == "message"]
    if messages:
        part = messages[0].content[0]
        assert part.text == text
        assert [lp.logprob for lp in part.logprobs] == call.logprobs
    assert final.usage.output_tokens == len(call.completion_ids)


async def test_a_chain_holds_each_message_once(tok, anyio_backend):
    """Three chained responses store what each added (its input + reply) and a link to the
    response it continued: 6 messages in all, not 2 + 4 + 6 copies; the third call's history is
    the whole conversation in order."""
    engine, _ = scripted(tok, "one", "two", "three")
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("c")
    prev = None
    for word in ("a", "b", "c"):
        body = {"model": "gyre", "input": word, **({"previous_response_id": prev} if prev else {})}
        status, raw = await asgi_post(proxy, "/v1/responses", key, body)
        assert status == 200, raw
        prev = json.loads(raw)["id"]
    links = proxy.responses_api._chains["c"]
    assert sum(len(link.messages) for link in links.values()) == 6
    history = links[prev].history()
    assert [(m.role, m.content) for m in history] == [
        ("user", "a"),
        ("assistant", "one"),
        ("user", "b"),
        ("assistant", "two"),
        ("user", "c"),
        ("assistant", "three"),
    ]
    check_extends(proxy.calls("c", full=True))
