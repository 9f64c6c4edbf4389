"""Every chat-like route's answer to one scripted reply, read back into one shape (`Answer`).

`ask(proxy, key, route, text_tools, stream=...)` posts a one-turn request to a route (Chat
Completions, Completions, Responses, Messages; plain or streamed) straight to the ASGI app and
reads its body the way a strict client would: a plain body must be one JSON value, a stream must
be well-formed server-sent events (every data line JSON, UTF-8) that end with the route's final
event (`[DONE]`, `message_stop`, `response.completed` / `.incomplete`). Used by the reply tests
(`test_replies_b33_b37.py`, `test_reply_fuzz.py`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tests.tito.conftest import asgi_post

ROUTES = ("chat", "completions", "responses", "messages")
CHAT_ROUTES = ("chat", "responses", "messages")
PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
}


def tools_for(route: str, names: tuple[str, ...]) -> list[dict[str, Any]]:
    """Tool definitions named `names` in the route's own shape."""
    schema = {"type": "object"}
    if route == "messages":
        return [{"name": n, "input_schema": schema} for n in names]
    if route == "responses":
        return [{"type": "function", "name": n, "parameters": schema} for n in names]
    return [{"type": "function", "function": {"name": n, "parameters": schema}} for n in names]


def request_body(
    route: str, *, stream: bool, tools: tuple[str, ...] = (), max_tokens: int = 4000
) -> dict[str, Any]:
    """A one-turn request to `route` offering `tools` (none: no tools field)."""
    body: dict[str, Any] = {"model": "gyre", "stream": stream}
    if route == "completions":
        return body | {"prompt": "go", "max_tokens": max_tokens}
    if route == "responses":
        body |= {"input": "go", "max_output_tokens": max_tokens}
    elif route == "messages":
        body |= {"messages": [{"role": "user", "content": "go"}], "max_tokens": max_tokens}
    else:
        body |= {"messages": [{"role": "user", "content": "go"}], "max_tokens": max_tokens}
    if tools:
        body["tools"] = tools_for(route, tools)
    return body


@dataclass
class Answer:
    """One route's answer, in one shape for every route."""

    status: int
    calls: list[tuple[str, Any]] = field(default_factory=list)
    """(name, arguments as a decoded JSON value) per tool call."""
    arguments: list[str] = field(default_factory=list)
    """Each call's arguments as the wire carried them (JSON text)."""
    content: str = ""
    reasoning: str | None = None
    finish: str | None = None
    """`tool_calls`, `stop` or `length`, whatever the route calls them."""
    tool_call_error: str | None = None
    token_ids: list[int] | None = None
    error: Any = None
    """The error body (status >= 400) or in-stream error event."""


_FINISH = {
    "tool_use": "tool_calls",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
}


def _sse(payload: bytes, *, named: bool) -> list[tuple[str | None, Any]]:
    """(event name, decoded data) of every frame; raises AssertionError unless well-formed."""
    text = payload.decode("utf-8")  # strict: a stream is UTF-8
    assert text.endswith("\n\n"), payload[-200:]
    frames = []
    for frame in text[:-2].split("\n\n"):
        lines = frame.split("\n")
        event = None
        if named:
            assert lines[0].startswith("event: "), frame
            event = lines.pop(0).removeprefix("event: ")
        assert len(lines) == 1 and lines[0].startswith("data: "), frame
        data = lines[0].removeprefix("data: ")
        frames.append((event, data if data == "[DONE]" else json.loads(data)))
    return frames


def _chat_message(a: Answer, msg: dict[str, Any], finish: str | None) -> None:
    a.content = msg.get("content") or ""
    a.reasoning = msg.get("reasoning_content")
    for tc in msg.get("tool_calls") or ():
        a.arguments.append(tc["function"]["arguments"])
        a.calls.append((tc["function"]["name"], json.loads(tc["function"]["arguments"])))
    a.tool_call_error = msg.get("gyre_tool_call_error")
    a.finish = finish


def _read_chat(a: Answer, payload: bytes, stream: bool) -> None:
    if not stream:
        choice = json.loads(payload)["choices"][0]
        _chat_message(a, choice["message"], choice["finish_reason"])
        a.token_ids = choice["token_ids"]
        return
    frames = _sse(payload, named=False)
    assert frames[-1][1] == "[DONE]", frames[-1]
    msg: dict[str, Any] = {"content": "", "tool_calls": []}
    ids: list[int] = []
    finish = None
    for _, chunk in frames[:-1]:
        if "error" in chunk:
            a.error = chunk["error"]
            continue
        for choice in chunk["choices"]:
            d = choice["delta"]
            msg["content"] += d.get("content") or ""
            if "reasoning_content" in d:
                msg["reasoning_content"] = msg.get("reasoning_content", "") + d["reasoning_content"]
            msg["tool_calls"] += d.get("tool_calls") or []
            if "gyre_tool_call_error" in d:
                msg["gyre_tool_call_error"] = d["gyre_tool_call_error"]
            ids += choice["token_ids"]
            finish = choice["finish_reason"] or finish
    _chat_message(a, msg, finish)
    a.token_ids = ids


def _read_completions(a: Answer, payload: bytes, stream: bool) -> None:
    if not stream:
        choice = json.loads(payload)["choices"][0]
        a.content, a.finish = choice["text"], choice["finish_reason"]
        a.token_ids = choice["token_ids"]
        return
    frames = _sse(payload, named=False)
    assert frames[-1][1] == "[DONE]", frames[-1]
    a.token_ids = []
    for _, chunk in frames[:-1]:
        if "error" in chunk:
            a.error = chunk["error"]
            continue
        for choice in chunk["choices"]:
            a.content += choice["text"]
            a.token_ids += choice["token_ids"]
            a.finish = choice["finish_reason"] or a.finish


def _message_blocks(a: Answer, blocks: list[dict[str, Any]]) -> None:
    for b in blocks:
        if b["type"] == "text":
            a.content += b["text"]
        elif b["type"] == "thinking":
            a.reasoning = (a.reasoning or "") + b["thinking"]
        elif b["type"] == "tool_use":
            raw = b["input"] if isinstance(b["input"], str) else json.dumps(b["input"])
            a.arguments.append(raw)
            a.calls.append((b["name"], json.loads(raw)))


def _read_messages(a: Answer, payload: bytes, stream: bool) -> None:
    if not stream:
        body = json.loads(payload)
        _message_blocks(a, body["content"])
        a.finish = _FINISH.get(body["stop_reason"], body["stop_reason"])
        a.tool_call_error = body["gyre"].get("tool_call_error")
        a.token_ids = body["gyre"]["token_ids"]
        return
    frames = _sse(payload, named=True)
    for event, data in frames:
        assert data["type"] == event, (event, data)
    if frames[-1][0] == "error":
        a.error = frames[-1][1]["error"]
        return
    assert frames[0][0] == "message_start" and frames[-1][0] == "message_stop", frames[-1]
    blocks: list[dict[str, Any]] = []
    for event, data in frames:
        if event == "content_block_start":
            assert data["index"] == len(blocks), data
            block = dict(data["content_block"])
            if block["type"] == "tool_use":
                block["input"] = ""
            blocks.append(block)
        elif event == "content_block_delta":
            block, d = blocks[data["index"]], data["delta"]
            if d["type"] == "text_delta":
                block["text"] += d["text"]
            elif d["type"] == "thinking_delta":
                block["thinking"] += d["thinking"]
            else:
                assert d["type"] == "input_json_delta", d
                block["input"] += d["partial_json"]
        elif event == "message_delta":
            a.finish = _FINISH.get(data["delta"]["stop_reason"], data["delta"]["stop_reason"])
            a.tool_call_error = data["gyre"].get("tool_call_error")
            a.token_ids = data["gyre"]["token_ids"]
    _message_blocks(a, blocks)


def _response(a: Answer, body: dict[str, Any]) -> None:
    for item in body["output"]:
        if item["type"] == "message":
            a.content += "".join(p["text"] for p in item["content"])
        elif item["type"] == "reasoning":
            a.reasoning = "".join(p["text"] for p in item["content"])
        elif item["type"] == "function_call":
            a.arguments.append(item["arguments"])
            a.calls.append((item["name"], json.loads(item["arguments"])))
    incomplete = body["status"] == "incomplete"
    a.finish = "tool_calls" if a.calls else "length" if incomplete else "stop"
    a.tool_call_error = body.get("gyre_tool_call_error")
    a.token_ids = body["token_ids"]


def _read_responses(a: Answer, payload: bytes, stream: bool) -> None:
    if not stream:
        _response(a, json.loads(payload))
        return
    frames = _sse(payload, named=True)
    for i, (event, data) in enumerate(frames):
        assert data["type"] == event and data["sequence_number"] == i, (i, event, data)
    last, data = frames[-1]
    if last == "error":
        a.error = data
        return
    assert last in ("response.completed", "response.incomplete"), last
    _response(a, data["response"])


_READERS = {
    "chat": _read_chat,
    "completions": _read_completions,
    "messages": _read_messages,
    "responses": _read_responses,
}


async def ask(
    proxy, key: str, route: str, *, stream: bool, tools: tuple[str, ...] = (), **kw: Any
) -> Answer:
    """POST a one-turn request to `route` and read its answer; AssertionError for a 5xx, a body
    that is not UTF-8 JSON or a stream that is not well-formed or not ended."""
    body = request_body(route, stream=stream, tools=tools, **kw)
    status, payload = await asgi_post(proxy, PATHS[route], key, body)
    assert status < 500, (route, stream, status, payload[-400:])
    a = Answer(status=status)
    if status >= 400:
        a.error = json.loads(payload.decode("utf-8"))
        return a
    _READERS[route](a, payload, stream)
    return a
