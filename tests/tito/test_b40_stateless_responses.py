"""Field case B40: stateless Responses clients (`store: false`, `include:
["reasoning.encrypted_content"]`, `reasoning.summary`) were refused on turn 1.

Driven with the official openai SDK the way Codex drives the API: turn 2 sends turn 1's output
items back as input, its reasoning item without its text (Codex leaves `reasoning_text` content
out: only `summary` and `encrypted_content` go back), and no `previous_response_id`. The seal
restores the reasoning exactly, so turn 2 renders the same prompt tokens as a stored
continuation, the tree keeps one path and nothing is healed; a seal altered, another
execution's or another proxy's is a 400 naming it."""

from __future__ import annotations

import json

import pytest

from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from tests.tito.conftest import asgi_post, encode, make_proxy, serving
from tests.tito.test_responses_api import ADD_TOOL

openai = pytest.importorskip("openai", reason="openai is a dependency of the [test] extra")
from openai.types.responses import Response, ResponseStreamEvent  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402

pytestmark = pytest.mark.anyio

TURN1 = (
    "<think>add them, carefully</think>\n"
    '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
)
TURN2 = "<think>the tool said 5</think>\nThe sum is 5."
USER = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "2+3?"}]}
STATELESS = {
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "reasoning": {"summary": "auto"},
}
BODY = {"model": "gyre", "tools": [ADD_TOOL], **STATELESS}
EVENTS = TypeAdapter(ResponseStreamEvent)


def _engine(tok, *texts: str) -> tuple[ScriptedEngine, list[list[int]]]:
    eos = tok.eos_token_id
    ids = [encode(tok, t) + [eos] for t in texts]
    return ScriptedEngine([ScriptedReply(token_ids=i) for i in ids], eos_token_id=eos), ids


def echo(output, codex: bool) -> list[dict]:
    """Turn 1's output items sent back: as the SDK dumps them, or as Codex sends them, every
    field but a reasoning item's `reasoning_text` content (codex-rs
    `should_serialize_reasoning_content`)."""
    items = []
    for o in output:
        item = o.model_dump(exclude_none=True)
        if codex and item["type"] == "reasoning":
            item.pop("content", None)
        items.append(item)
    return items


def result_of(call) -> dict:
    return {"type": "function_call_output", "call_id": call.call_id, "output": "5"}


async def _create(client, stream: bool, **body) -> Response:
    """One `responses.create` (or a `responses.stream`, every event checked against the SDK's
    types), the final response strictly validated."""
    if not stream:
        resp = await client.responses.create(**body)
    else:
        async with client.responses.stream(**body) as events:
            kinds = []
            async for event in events:
                EVENTS.validate_python(event.model_dump(warnings=False))
                kinds.append(event.type)
                if event.type == "response.output_item.done" and event.item.type == "reasoning":
                    assert event.item.encrypted_content  # Codex keeps the item of this event
                    assert event.item.summary[0].text == event.item.content[0].text
            resp = await events.get_final_response()
        assert "response.reasoning_summary_text.delta" in kinds
    return Response.model_validate(resp.model_dump(warnings=False))


@pytest.mark.parametrize("codex", [True, False], ids=["codex_echo", "sdk_echo"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_b40_stateless_turn_2_renders_the_stored_continuation(
    tok, anyio_backend, stream, codex
):
    engine, ids = _engine(tok, TURN1, TURN2, TURN1, TURN2)
    proxy = make_proxy(tok, engine)
    keys = {"sl": proxy.mint_key("sl"), "st": proxy.mint_key("st")}
    common = dict(model="gyre", instructions="Use the tool.", tools=[ADD_TOOL])
    async with serving(proxy) as base:
        client = openai.AsyncOpenAI(base_url=base, api_key=keys["sl"], max_retries=0)
        first = await _create(client, stream, input=[USER], **common, **STATELESS)
        reasoning = first.output[0]
        assert (first.store, reasoning.type) == (False, "reasoning")
        assert reasoning.content[0].text == "add them, carefully"
        assert reasoning.summary[0].text == "add them, carefully"  # summary "auto"
        assert reasoning.encrypted_content.startswith("gyre.r1.")
        items = [USER, *echo(first.output, codex), result_of(first.output[-1])]
        assert ("content" not in items[1]) is codex and "encrypted_content" in items[1]
        second = await _create(client, stream, input=items, **common, **STATELESS)
        assert second.output_text == "The sum is 5." and second.output[0].encrypted_content
        # A response created with store: false cannot be chained onto.
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.create(
                previous_response_id=first.id, input=[USER], **common, **STATELESS
            )
        assert refused.value.body["param"] == "previous_response_id"
        assert "store: false" in refused.value.body["message"]
        # The same conversation, stored and chained (`previous_response_id`).
        stored = openai.AsyncOpenAI(base_url=base, api_key=keys["st"], max_retries=0)
        head = await stored.responses.create(input=[USER], **common)
        await stored.responses.create(
            previous_response_id=head.id, input=[result_of(head.output[-1])], **common
        )
        await client.close()
        await stored.close()
    sl, st = proxy.calls("sl", full=True), proxy.calls("st", full=True)
    assert [c.completion_ids for c in sl] == ids[:2] and [c.completion_ids for c in st] == ids[2:]
    assert [c.prompt_ids for c in sl] == [c.prompt_ids for c in st]  # token for token
    # One path: turn 2 extends turn 1's prompt + completion, nothing healed or branched.
    refs = proxy.calls("sl")
    assert refs[1].parent_call_id == refs[0].call_id and refs[1].divergence is None
    assert refs[1].shared_len == len(sl[0].prompt_ids) + len(ids[0])
    assert sl[1].heals == () and proxy.statistics().heals == 0
    assert proxy.statistics().divergences == 0


async def _turn_1(proxy, key: str) -> dict:
    """Turn 1 of a stateless client, straight to the ASGI app: the response's JSON."""
    status, raw = await asgi_post(proxy, "/v1/responses", key, {"input": [USER], **BODY})
    assert status == 200, raw
    return json.loads(raw)


def _flip(sealed: str, at: int) -> str:
    return sealed[:at] + ("A" if sealed[at] != "A" else "B") + sealed[at + 1 :]


@pytest.mark.parametrize(
    "alter",
    [
        lambda s: _flip(s, len("gyre.r1.") + 5),  # the payload (its text or its execution)
        lambda s: _flip(s, len(s) - 3),  # the MAC
        lambda s: s[:-1],
        lambda s: s + "A",
        lambda s: s.replace("gyre.r1.", "gyre.r2."),
        lambda s: "not a seal",
        lambda s: 42,
    ],
    ids=["payload", "mac", "cut", "longer", "version", "foreign", "not_a_string"],
)
async def test_b40_tampered_encrypted_content_is_a_400_naming_it(tok, anyio_backend, alter):
    engine, _ = _engine(tok, TURN1, TURN2)
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("t")
    first = await _turn_1(proxy, key)
    items = [USER, *first["output"]]
    items[1] = {k: v for k, v in items[1].items() if k != "content"}
    items[1]["encrypted_content"] = alter(items[1]["encrypted_content"])
    items.append({"type": "function_call_output", "call_id": items[-1]["call_id"], "output": "5"})
    status, raw = await asgi_post(proxy, "/v1/responses", key, {"input": items, **BODY})
    err = json.loads(raw)["error"]
    assert status == 400, raw
    assert err["param"] == "input[1].encrypted_content"
    assert err["message"].startswith("input[1].encrypted_content ")
    assert len(proxy.calls("t")) == 1  # nothing recorded for the refused turn


async def test_b40_a_seal_opens_only_for_its_execution_and_proxy(tok, anyio_backend):
    """Execution b cannot replay execution a's reasoning, nor can a proxy accept another
    proxy's seal (a restarted node's): both are 400s naming the item's `encrypted_content`;
    the seal itself opens for its execution with the text and response it was issued for."""
    engine, _ = _engine(tok, TURN1, TURN1)
    proxy = make_proxy(tok, engine)
    a, b = proxy.mint_key("a"), proxy.mint_key("b")
    first = await _turn_1(proxy, a)
    sealed = first["output"][0]["encrypted_content"]
    assert proxy.responses_api.seal.open(sealed, "a") == (first["id"], "add them, carefully")
    body = {"input": [USER, first["output"][0]], **BODY}  # its text too: the seal is checked
    status, raw = await asgi_post(proxy, "/v1/responses", b, body)
    err = json.loads(raw)["error"]
    assert status == 400 and err["param"] == "input[1].encrypted_content", raw
    assert "another execution" in err["message"]
    other = make_proxy(tok, _engine(tok, TURN1)[0])
    key = other.mint_key("a")  # the same execution name, on another proxy
    assert other.responses_api.seal is not proxy.responses_api.seal
    status, raw = await asgi_post(other, "/v1/responses", key, body)
    err = json.loads(raw)["error"]
    assert status == 400 and err["code"] == "invalid_encrypted_content", raw
    assert proxy.calls("b") == [] and other.calls("a") == []


def test_b40_seal_round_trips_text_exactly() -> None:
    """Any reasoning text (control tokens, surrogate-free unicode, empty) round-trips."""
    from gyre.tito.reasoning_seal import ReasoningSeal  # new with B40: the others fail first

    seal = ReasoningSeal()
    for text in ["", "<|im_end|>\n<tool_call>", 'é\u2028\U0001f600 \\ "q"', "x" * 10000]:
        assert seal.open(seal.seal("ex", "resp_1", text), "ex") == ("resp_1", text)
    with pytest.raises(ValueError, match="32"):
        ReasoningSeal(b"short")
