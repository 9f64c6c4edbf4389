"""Field cases B33 and B37 (docs/field_cases.md) through every chat-like route, plain and streamed:
a closing tag inside a string argument is text (B33), a lone surrogate escape in the arguments is
a reported malformed call, never a 500 or a cut stream (B37). gyre's own format with the tiny
tokenizer, and each vLLM-parsed family of `tests/tito/families.py` on the Chat route."""

from __future__ import annotations

import json

import pytest

from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from tests.tito.answers import CHAT_ROUTES, Answer, ask
from tests.tito.conftest import encode, make_proxy
from tests.tito.families import FAMILIES, family_tokenizer
from tests.tito.written import sampled_ids, write_call

pytestmark = pytest.mark.anyio

NOTE = "Call a tool as <tool_call>{...}</tool_call> and then stop."
B33_REPLY = (
    '<tool_call>{"name": "write_file", "arguments": {"path": "NOTES.md", "content": '
    f'"{NOTE}"}}}}</tool_call>'
)
CASES = [(route, stream) for route in CHAT_ROUTES for stream in (False, True)]


async def each_route(tok, text: str) -> tuple[list[int], dict, object]:
    """The reply `text` (+ EOS) scripted once per route and mode; (its IDs, answers, proxy)."""
    ids = encode(tok, text) + [tok.eos_token_id]
    engine = ScriptedEngine(
        [ScriptedReply(token_ids=ids) for _ in CASES],
        eos_token_id=tok.eos_token_id,
        max_model_len=len(ids) + 1000,
    )
    proxy = make_proxy(tok, engine)
    answers = {}
    for route, stream in CASES:
        key = proxy.mint_key(f"{route}-{stream}")
        answers[route, stream] = await ask(
            proxy, key, route, stream=stream, tools=("write_file",), max_tokens=len(ids)
        )
    return ids, answers, proxy


def check_recorded_once(proxy, ids: list[int]) -> None:
    for route, stream in CASES:
        calls = proxy.calls(f"{route}-{stream}", full=True)
        assert [c.completion_ids for c in calls] == [ids], (route, stream)


async def test_b33_closing_tag_inside_a_string_argument_is_text(tok, anyio_backend):
    assert json.loads(B33_REPLY[len("<tool_call>") : -len("</tool_call>")])["arguments"] == {
        "path": "NOTES.md",
        "content": NOTE,
    }
    ids, answers, proxy = await each_route(tok, B33_REPLY)
    for case, a in answers.items():
        assert a.status == 200, case
        assert a.calls == [("write_file", {"path": "NOTES.md", "content": NOTE})], (case, a)
        assert a.finish == "tool_calls" and a.tool_call_error is None, (case, a)
        assert a.content == "" and a.token_ids == ids, (case, a)
    # The model's own argument text, on every route that carries text.
    raw = B33_REPLY[len('<tool_call>{"name": "write_file", "arguments": ') : -len("}</tool_call>")]
    assert {a.arguments[0] for a in answers.values()} == {raw}
    check_recorded_once(proxy, ids)


@pytest.mark.parametrize(
    "reply",
    [
        '<tool_call>{"name": "write_file", "arguments": {"path": "a", "content": '
        '"smile \\ud83d"}}</tool_call>',
        '<tool_call>{"name":"write_file","arguments":{"path":"a","content":"smile \\ud83d"}}'
        "</tool_call>",
    ],
    ids=["canonical", "compact"],
)
async def test_b37_lone_surrogate_escape_is_a_reported_malformed_call(tok, anyio_backend, reply):
    ids, answers, proxy = await each_route(tok, reply)
    for case, a in answers.items():
        # 200, UTF-8 JSON (read strictly by `ask`), streams ended by their final event; the
        # text stays content as sampled (the escape is six ASCII characters) and the agent is
        # told why its call was not taken.
        assert a.status == 200 and a.error is None, (case, a)
        assert a.calls == [] and a.content == reply and a.finish == "stop", (case, a)
        assert "lone surrogate escape \\ud83d" in (a.tool_call_error or ""), (case, a)
        assert a.token_ids == ids, case
    check_recorded_once(proxy, ids)


async def test_a_paired_surrogate_escape_is_a_call(tok, anyio_backend):
    """An escaped emoji (both halves) is an ordinary call, as the model wrote it."""
    reply = (
        '<tool_call>{"name": "write_file", "arguments": {"path": "a", "content": '
        '"smile \\ud83d\\ude00"}}</tool_call>'
    )
    ids, answers, proxy = await each_route(tok, reply)
    for case, a in answers.items():
        assert a.calls == [("write_file", {"path": "a", "content": "smile \U0001f600"})], case
        assert a.finish == "tool_calls" and a.tool_call_error is None, case
    check_recorded_once(proxy, ids)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    name = request.param
    return name, family_tokenizer(name, tmp_path_factory.mktemp(name))


async def family_answers(name, tok, reply: str) -> tuple[list[int], list[Answer], object]:
    fam = FAMILIES[name]
    ids = sampled_ids(tok, name, reply) + [tok.eos_token_id]
    engine = ScriptedEngine(
        [ScriptedReply(token_ids=ids) for _ in range(2)],
        eos_token_id=tok.eos_token_id,
        vocab_size=len(tok),
    )
    proxy = make_proxy(
        tok, engine, tool_parser=fam.tool_parser, reasoning_parser=fam.reasoning_parser
    )
    answers = []
    for stream in (False, True):
        key = proxy.mint_key(f"chat-{stream}")
        answers.append(await ask(proxy, key, "chat", stream=stream, tools=("write_file",)))
    return ids, answers, proxy


@pytest.mark.parametrize(
    "content",
    [NOTE, "<|im_end|> and </think>", "[TOOL_CALLS]x[ARGS]{}", "```<｜tool▁call▁end｜>"],
    ids=["closing-tag", "chatml-and-think", "mistral-markers", "deepseek-markers"],
)
async def test_b33_control_token_text_in_a_string_argument_in_every_family(
    family, content, anyio_backend
):
    """Each family's call carrying every family's marker text in a string argument comes back
    as that one call, with the string exactly (vLLM's hermes parser dropped the call at the
    inner `</tool_call>`, qwen3's reasoning parser deleted `<|im_end|>` and `</think>` from the
    argument, Mistral's split the call at the inner `[TOOL_CALLS]`)."""
    name, tok = family
    arguments = {"path": "NOTES.md", "content": content}
    ids, answers, proxy = await family_answers(name, tok, write_call(tok, name, arguments))
    for a in answers:
        assert a.status == 200 and a.calls == [("write_file", arguments)], (name, a)
        assert a.finish == "tool_calls" and a.tool_call_error is None, (name, a)
    for stream in (False, True):
        assert [c.completion_ids for c in proxy.calls(f"chat-{stream}", full=True)] == [ids]


async def test_b37_lone_surrogate_in_every_family(family, anyio_backend):
    name, tok = family
    # As the model samples it: the escape's six characters (a template cannot render a lone
    # surrogate: no UTF-8 text holds one).
    reply = write_call(tok, name, {"path": "a", "content": "smile @"}).replace("@", "\\ud83d")
    ids, answers, proxy = await family_answers(name, tok, reply)
    for a in answers:
        assert a.status == 200 and a.error is None and a.calls == [], (name, a)
        assert "lone surrogate escape \\ud83d" in (a.tool_call_error or ""), (name, a)
        assert a.finish == "stop" and a.token_ids == ids, (name, a)
    for stream in (False, True):
        assert [c.completion_ids for c in proxy.calls(f"chat-{stream}", full=True)] == [ids]


@pytest.mark.parametrize(
    "arguments, why",
    [
        ('{"x": NaN}', "NaN is not a JSON number"),
        ('{"x": -Infinity}', "-Infinity is not a JSON number"),
        ('{"x": 1e400}', "number 1e400 is beyond a double"),
        ('{"x": ' + "[" * 128 + "]" * 128 + "}", "nested deeper than 128 levels"),
        ('{"x": ' + "[" * 3000 + "]" * 3000 + "}", "nested"),
        ('{"c": 1, "c": 2}', "duplicate member name 'c'"),
        ('{"c": {"d": 1, "d": 1}}', "duplicate member name 'd'"),
    ],
    ids=["nan", "infinity", "beyond-a-double", "129-levels", "3000-levels", "dup", "dup-nested"],
)
async def test_b37_arguments_json_cannot_carry_are_a_reported_malformed_call(
    tok, anyio_backend, arguments, why
):
    """B37's class: what Python's decoder takes but I-JSON does not (NaN, a number beyond a
    double, nesting past 128 levels, or past the decoder's recursion limit: was a 500; a member
    name twice: Chat and Responses passed both on, Messages kept the last) is a malformed call
    on every route, never JSON a strict client cannot read or a silent `null`."""
    reply = f'<tool_call>{{"name": "write_file", "arguments": {arguments}}}</tool_call>'
    ids, answers, proxy = await each_route(tok, reply)
    for case, a in answers.items():
        assert a.status == 200 and a.error is None, (case, a)
        assert a.calls == [] and a.content == reply and a.finish == "stop", (case, a)
        assert why in (a.tool_call_error or ""), (case, a.tool_call_error)
    check_recorded_once(proxy, ids)
