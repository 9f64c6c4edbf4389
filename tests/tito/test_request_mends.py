"""Bad requests a fresh user sends get a 400 naming the field, on every route (issue 45 review):
a message without its text, a lone surrogate escape anywhere in a body, a content part without
`text`, unknown keys in messages, content parts and input items, an out-of-vocabulary stop or
prompt token ID, an output format xgrammar cannot compile, a reserved `chat_template_kwargs` key;
and a reply's empty content reads the same streamed and plain."""

from __future__ import annotations

import inspect
import json

import pytest

from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from gyre.tito.openai_requests import RESERVED_TEMPLATE_KWARGS
from gyre.tito.template_input import message_to_template
from gyre.tito.wire import ChatMessage
from tests.tito.conftest import asgi_post, encode, make_proxy

pytestmark = pytest.mark.anyio

PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
    "count_tokens": "/v1/messages/count_tokens",
}
HI = {"role": "user", "content": "hi"}
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    ],
}
TOOLS = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Sent:
    """One request's answer: status, JSON body, the prompt the engine got (None: no engine
    call)."""

    def __init__(self, status: int, body: bytes, prompt: list[int] | None) -> None:
        self.status, self.raw, self.prompt = status, body, prompt

    @property
    def body(self) -> dict:
        return json.loads(self.raw)

    @property
    def error(self) -> dict:
        return self.body["error"]


async def send(tok, route: str, body: dict | bytes, reply: str = "ok") -> Sent:
    """`body` (completed with the model name) posted to `route` of a fresh proxy."""
    engine = ScriptedEngine(
        [ScriptedReply(token_ids=encode(tok, reply) + [tok.eos_token_id])],
        eos_token_id=tok.eos_token_id,
        vocab_size=len(tok),
    )
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("e")
    if isinstance(body, dict):
        body = {"model": "gyre", **body}
        if route == "messages":
            body.setdefault("max_tokens", 16)
    status, out = await asgi_post(proxy, PATHS[route], key, body)
    prompt = list(engine.requests_seen[-1].prompt_ids) if engine.requests_seen else None
    return Sent(status, out, prompt)


def names(route: str, sent: Sent, param: str) -> bool:
    """Whether a 400 names `param`: OpenAI's `param`, or Anthropic's message (it has none)."""
    if sent.status != 400:
        return False
    if route in ("messages", "count_tokens"):
        return param in sent.error["message"]
    return sent.error["param"] == param


# -- a message without its text --------------------------------------------------------------


@pytest.mark.parametrize(
    "route, body, param",
    [
        ("chat", {"messages": [{"role": "user"}]}, "messages[0].content"),
        ("chat", {"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
        ("chat", {"messages": [{"role": "system"}, HI]}, "messages[0].content"),
        ("chat", {"messages": [{"role": "developer"}, HI]}, "messages[0].content"),
        ("chat", {"messages": [HI, {"role": "assistant"}, HI]}, "messages[1].content"),
        (
            "chat",
            {"messages": [HI, CALL, {"role": "tool", "tool_call_id": "call_1"}]},
            "messages[2].content",
        ),
        ("responses", {"input": [{"role": "user"}]}, "input[0].content"),
        ("responses", {"input": [{"type": "message", "role": "system"}, HI]}, "input[0].content"),
        (
            "responses",
            {
                "input": [
                    {"type": "function_call", "call_id": "c", "name": "ls", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c"},
                ]
            },
            "input[1].output",
        ),
        (
            "responses",
            {"input": [HI, {"type": "function_call_output", "call_id": "c", "output": "x"}]},
            "input[1].call_id",
        ),
        ("chat", {"messages": [{"content": "hi"}]}, "messages[0].role"),
        ("completions", {}, "prompt"),
        ("messages", {"messages": [{"role": "user"}]}, "messages[0].content"),
    ],
    ids=[
        "chat-user",
        "chat-user-null",
        "chat-system",
        "chat-developer",
        "chat-assistant",
        "chat-tool",
        "responses-user",
        "responses-system",
        "responses-tool-output",
        "responses-orphan-output",
        "chat-no-role",
        "completions-no-prompt",
        "messages-user",
    ],
)
async def test_a_message_without_its_text_is_a_400_naming_it(tok, route, body, param):
    """It rendered `user\\nNone`, `<tool_response>None</tool_response>`, or no system prompt."""
    sent = await send(tok, route, body)
    assert names(route, sent, param), sent.raw
    assert sent.prompt is None


async def test_an_assistant_message_of_tool_calls_or_reasoning_alone_renders_no_none(tok):
    """Content may be absent when the message carries calls or reasoning: the template never
    sees a None it could print as `None`."""
    calls = await send(
        tok,
        "chat",
        {"messages": [HI, CALL, {"role": "tool", "tool_call_id": "call_1", "content": "x"}]},
    )
    thought = await send(
        tok, "chat", {"messages": [HI, {"role": "assistant", "reasoning_content": "hmm"}, HI]}
    )
    for sent in (calls, thought):
        assert sent.status == 200, sent.raw
        assert "None" not in tok.decode(sent.prompt)
    d = message_to_template(ChatMessage(role="assistant", reasoning_content="hmm"))
    assert d["content"] == ""


# -- out-of-vocabulary token IDs, outputs xgrammar cannot compile, reserved template kwargs ----


@pytest.mark.parametrize(
    "route, body, param",
    [
        ("chat", {"messages": [HI], "stop_token_ids": [-1]}, "stop_token_ids"),
        ("chat", {"messages": [HI], "stop_token_ids": [10**6]}, "stop_token_ids"),
        ("completions", {"prompt": "hi", "stop_token_ids": [10**6]}, "stop_token_ids"),
        ("completions", {"prompt": [10**6]}, "prompt"),
        ("completions", {"prompt": [[1, -1]]}, "prompt"),
        (
            "chat",
            {
                "messages": [HI],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "bogus"}},
                },
            },
            "response_format",
        ),
        (
            "chat",
            {
                "messages": [HI],
                "tools": TOOLS,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"$ref": "#/nope"}},
                },
            },
            "response_format",
        ),
        (
            "completions",
            {
                "prompt": "hi",
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "bogus"}},
                },
            },
            "response_format",
        ),
        (
            "chat",
            {"messages": [HI], "structured_outputs": {"regex": "("}},
            "structured_outputs.regex",
        ),
        ("chat", {"messages": [HI], "guided_json": {"type": "bogus"}}, "guided_json"),
        (
            "responses",
            {
                "input": "hi",
                "text": {
                    "format": {"type": "json_schema", "name": "x", "schema": {"type": "bogus"}}
                },
            },
            "text.format",
        ),
        (
            "responses",
            {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}},
            "text.format",
        ),
        (
            "messages",
            {
                "messages": [HI],
                "output_config": {"format": {"type": "json_schema", "schema": {"type": "bogus"}}},
            },
            "output_config.format",
        ),
    ],
    ids=[
        "stop-negative",
        "stop-beyond",
        "completions-stop",
        "prompt-beyond",
        "prompt-negative",
        "response-format",
        "response-format-with-tools",
        "completions-response-format",
        "structured-regex",
        "guided-json",
        "responses-format",
        "responses-format-no-schema",
        "messages-format",
    ],
)
async def test_a_bad_value_of_a_sampling_field_is_a_400_naming_it(tok, route, body, param):
    """The engine refused them with `request 'e/c0': ...` (its internal ID) and no field;
    xgrammar's message named its C++ source file."""
    sent = await send(tok, route, body)
    assert names(route, sent, param), sent.raw
    message = sent.error["message"]
    assert "request '" not in message and ".cc" not in message and "/project" not in message
    assert sent.prompt is None


@pytest.mark.parametrize(
    "key",
    [
        "add_generation_prompt",
        "tools",
        "messages",
        "tokenize",
        "chat_template",
        "continue_final_message",
    ],
)
@pytest.mark.parametrize("route", ["chat", "responses"])
async def test_a_reserved_chat_template_kwargs_key_is_a_400_naming_it(tok, route, key):
    """It was a 400 naming `messages` with Python's "got multiple values for keyword argument",
    or (`chat_template`, `continue_final_message`) rendered as the client asked, past the
    proxy's own checks."""
    base = {"messages": [HI]} if route == "chat" else {"input": "hi"}
    sent = await send(tok, route, {**base, "chat_template_kwargs": {key: False}})
    assert names(route, sent, f"chat_template_kwargs.{key}"), sent.raw
    assert "multiple values" not in sent.error["message"]
    ok = await send(tok, route, {**base, "chat_template_kwargs": {"verbosity": "low"}})
    assert ok.status == 200, ok.raw


def test_the_reserved_keys_are_every_argument_of_apply_chat_template():
    """A newer transformers' argument would collide with a client's key of that name."""
    from transformers import PreTrainedTokenizerBase
    from transformers.utils.chat_template_utils import render_jinja_template

    named = {
        name
        for fn in (PreTrainedTokenizerBase.apply_chat_template, render_jinja_template)
        for name, p in inspect.signature(fn).parameters.items()
        if name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD
    }
    assert named | {"messages"} == RESERVED_TEMPLATE_KWARGS


# -- content parts and unknown keys ---------------------------------------------------------
# -- a lone surrogate escape anywhere in a body ---------------------------------------------


LONE = "a\\ud800b"
"""As a JS client writes a string it cut in the middle of an emoji: the escape of half a pair."""


@pytest.mark.parametrize(
    "route, raw, param",
    [
        (
            "chat",
            '{"model":"gyre","messages":[{"role":"user","content":"%s"}]}',
            "messages[0].content",
        ),
        ("completions", '{"model":"gyre","prompt":"%s"}', "prompt"),
        ("responses", '{"model":"gyre","input":"%s"}', "input"),
        (
            "responses",
            '{"model":"gyre","input":[{"role":"user","content":[{"type":"input_text",'
            '"text":"ok"},{"type":"input_text","text":"%s"}]}]}',
            "input[0].content[1].text",
        ),
        (
            "messages",
            '{"model":"gyre","max_tokens":5,"messages":[{"role":"user","content":"%s"}]}',
            "messages[0].content",
        ),
        (
            "count_tokens",
            '{"model":"gyre","messages":[{"role":"user","content":"%s"}]}',
            "messages[0].content",
        ),
        (
            "chat",
            '{"model":"gyre","messages":[{"role":"user","content":"hi","\\udc00":1}]}',
            "messages[0]",
        ),
    ],
    ids=["chat", "completions", "responses", "responses-part", "messages", "count", "chat-key"],
)
async def test_a_lone_surrogate_escape_is_a_400_naming_its_field(tok, route, raw, param):
    """msgspec refuses the body as "Input data was truncated" with no field; the stdlib decoder
    reads it, so the error path finds the string (refused, not replaced: that would change the
    client's data)."""
    body = raw.replace("%s", LONE).encode()
    assert json.loads(body)  # the stdlib takes it: the escape is JSON, its text is not Unicode
    sent = await send(tok, route, body)
    assert names(route, sent, param), sent.raw
    message = sent.error["message"]
    assert "surrogate" in message and "truncated" not in message, message


@pytest.mark.parametrize(
    "route, body, param",
    [
        (
            "chat",
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages[0].content[0].text",
        ),
        (
            "chat",
            {
                "messages": [
                    HI,
                    {
                        "role": "assistant",
                        "content": [{"type": "text", "text": "a"}, {"type": "text"}],
                    },
                    HI,
                ]
            },
            "messages[1].content[1].text",
        ),
        (
            "chat",
            {"messages": [{"role": "user", "content": [{"type": "text", "txt": "hi"}]}]},
            "messages[0].content[0].txt",
        ),
        ("chat", {"messages": [{"role": "user", "contnet": "hi"}]}, "messages[0].contnet"),
        ("chat", {"messages": [{"role": "user", "content": "hi", "foo": 1}]}, "messages[0].foo"),
        (
            "chat",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "foo": 1}]}]},
            "messages[0].content[0].foo",
        ),
        (
            "chat",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "http://x"}}],
                    }
                ]
            },
            "messages[0].content[0].type",
        ),
        ("responses", {"input": [{"role": "user", "content": "hi", "foo": 1}]}, "input[0].foo"),
        (
            "responses",
            {
                "input": [
                    {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "hi", "foo": 1}],
                    }
                ]
            },
            "input[0].content[0].foo",
        ),
        (
            "responses",
            {
                "input": [
                    {
                        "type": "function_call",
                        "call_id": "c",
                        "name": "ls",
                        "arguments": "{}",
                        "namespace": "ns",
                    },
                    {"type": "function_call_output", "call_id": "c", "output": "x"},
                ]
            },
            "input[0].namespace",
        ),
        (
            "responses",
            {
                "input": [
                    {
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": "x"}],
                        "phase": "commentary",
                    },
                    HI,
                ]
            },
            "input[0].phase",
        ),
    ],
    ids=[
        "text-missing",
        "text-missing-later",
        "text-misspelt",
        "content-misspelt",
        "message-key",
        "part-key",
        "image-part",
        "responses-item-key",
        "responses-part-key",
        "responses-namespace",
        "responses-phase",
    ],
)
async def test_content_parts_and_unknown_keys_are_400s_naming_them(tok, route, body, param):
    """A text part without `text` was refused as "content part of type 'text' is not supported";
    unknown keys of chat messages, content parts and Responses items were dropped silently."""
    sent = await send(tok, route, body)
    assert names(route, sent, param), sent.raw
    assert "not supported (text only)" not in sent.error["message"] or param.endswith(".type")


async def test_echoed_response_fields_are_accepted_without_effect(tok):
    """What real clients echo of a reply renders exactly as the reply without them: a chat
    message's `refusal`, `annotations`, `audio` and gyre's own `gyre_tool_call_error`, a text
    part's `prompt_cache_breakpoint`; a Responses output item's `id`, `status`, an output text's
    `annotations` and `logprobs`, a call's `caller` (direct)."""
    plain = await send(tok, "chat", {"messages": [HI, {"role": "assistant", "content": "ok"}, HI]})
    echoed = await send(
        tok,
        "chat",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "hi", "prompt_cache_breakpoint": {}}],
                },
                {
                    "role": "assistant",
                    "content": "ok",
                    "refusal": None,
                    "annotations": [],
                    "audio": None,
                    "gyre_tool_call_error": "malformed tool call: x",
                },
                HI,
            ]
        },
    )
    assert plain.status == echoed.status == 200, echoed.raw
    assert plain.prompt == echoed.prompt
    items = [
        HI,
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "ok", "annotations": [], "logprobs": []}],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "c",
            "name": "ls",
            "arguments": "{}",
            "status": "completed",
            "caller": {"type": "direct"},
        },
        {"type": "function_call_output", "call_id": "c", "output": "x", "status": "completed"},
    ]
    bare = [
        HI,
        {"role": "assistant", "content": "ok"},
        {"type": "function_call", "call_id": "c", "name": "ls", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "x"},
    ]
    full = await send(tok, "responses", {"input": items})
    lean = await send(tok, "responses", {"input": bare})
    assert full.status == lean.status == 200, full.raw
    assert full.prompt == lean.prompt


# -- a reply without content, streamed or not -------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    ['<think>hmm <tool_call>{"name": "ls", "arguments": {}}</tool_call>', "<think>hmm</think>", ""],
    ids=["think-never-closed", "reasoning-only", "empty"],
)
async def test_an_empty_content_reads_the_same_streamed_and_plain(tok, reply):
    """Plain: `content: ""`; streamed it was no content delta at all, which clients read as
    null (and echo back as a message without content)."""
    body = {"messages": [HI], "tools": TOOLS}
    plain = await send(tok, "chat", body, reply)
    message = plain.body["choices"][0]["message"]
    assert message["content"] == "" and "tool_calls" not in message, message
    streamed = await send(tok, "chat", {**body, "stream": True}, reply)
    deltas = [
        json.loads(line.removeprefix(b"data: "))["choices"]
        for line in streamed.raw.split(b"\n\n")
        if line.startswith(b"data: {")
    ]
    contents = [c["delta"]["content"] for cs in deltas for c in cs if "content" in c["delta"]]
    assert contents and "".join(contents) == message["content"], deltas
