"""OpenAI's format out: responses and server-sent events of one model call.

Owns the assistant message of a choice (`reply_message`), response bodies (`chat_completion`,
`text_completion`: logprobs, usage, the `gyre` block) and the SSE streams (`chat_stream`,
`completion_stream`, which have the `Recorder` record the call before their last chunk). Every
choice carries its `token_ids`; `return_token_ids: true` (vLLM's flag) adds `prompt_token_ids`.
Knows nothing about routes, API keys or how the engine is driven. Requests in are
`openai_requests`'.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import msgspec

from gyre.errors import EngineError
from gyre.tito.detok import TokenText
from gyre.tito.generation import Call, Choice
from gyre.tito.model_format import GyreParser, ToolCallIds
from gyre.tito.recorder import Recorder
from gyre.tito.wire import (
    JSON_ENCODER,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    ToolCall,
    error_body,
)

__all__ = [
    "reply_message",
    "chat_reply",
    "chat_completion",
    "text_completion",
    "stream_text",
    "chat_stream",
    "completion_stream",
]


_GYRE_PARSER = GyreParser()
"""Calls started without a parser (tests building a `Call` directly) parse gyre's format."""
_OPENAI_IDS = ToolCallIds()


def _named(call: Call, ch: Choice, calls: tuple[ToolCall, ...]) -> list[ToolCall]:
    """`calls` with the IDs the model format mints (`ToolCallIds`: its rule, deterministic,
    unique within the execution)."""
    ids = call.tool_ids or _OPENAI_IDS
    where = (call.execution.execution_id, call.choice_call_id(ch.index))
    return [msgspec.structs.replace(tc, id=ids.mint(*where, i)) for i, tc in enumerate(calls)]


def reply_message(call: Call, ch: Choice) -> tuple[dict[str, Any], ChatMessage]:
    """(JSON message for the client, the ChatMessage the renderer compares echoes with)."""
    parser = call.reply_parser or _GYRE_PARSER
    parsed = parser.parse(ch.text, "call", tools=call.rendered.tools if call.parse_tools else None)
    calls = _named(call, ch, parsed.tool_calls) or None
    content = parsed.content if parsed.content or not calls else None
    msg = ChatMessage(
        role="assistant", content=content, reasoning_content=parsed.reasoning, tool_calls=calls
    )
    out: dict[str, Any] = {"role": "assistant", "content": content}
    if parsed.reasoning is not None:
        out["reasoning_content"] = parsed.reasoning
    if calls:
        out["tool_calls"] = [
            {
                "id": tc.id,
                "type": "function",
                "function": {"name": tc.function.name, "arguments": tc.function.arguments},
            }
            for tc in calls
        ]
    if parsed.tool_call_error is not None and ch.finish != "length":
        # A reply cut off by max_tokens is truncated, not malformed (B15): no tool error.
        out["gyre_tool_call_error"] = parsed.tool_call_error
    return out, msg


def chat_reply(call: Call, ch: Choice) -> ChatMessage:
    """The assistant message of a chat choice, as the renderer compares echoes with it."""
    return reply_message(call, ch)[1]


def chat_completion(
    call: Call,
    req: ChatCompletionRequest,
    replies: list[tuple[dict[str, Any], ChatMessage]],
    *,
    text: TokenText,
    model: str,
) -> dict[str, Any]:
    """The `chat.completion` body of a finished call; `replies` from `reply_message` per choice."""
    body = {
        "id": f"chatcmpl-{call.request_id}",
        "object": "chat.completion",
        "created": call.created,
        "model": model,
        "choices": [
            {
                "index": ch.index,
                "message": msg,
                "logprobs": _logprobs_chat(text, ch.ids, ch.lps, ch.top_ids, ch.top_lps)
                if req.logprobs
                else None,
                "finish_reason": "tool_calls" if msg.get("tool_calls") else ch.finish,
                "token_ids": ch.ids,
            }
            for ch, (msg, _) in zip(call.choices, replies)
        ],
        "usage": _usage(call),
        "gyre": _gyre_info(call),
    }
    if req.return_token_ids:
        body["prompt_token_ids"] = call.rendered.prompt_ids
    return body


def text_completion(
    call: Call, req: CompletionRequest, *, text: TokenText, model: str
) -> dict[str, Any]:
    """The `text_completion` body of a finished call."""
    body = {
        "id": f"cmpl-{call.request_id}",
        "object": "text_completion",
        "created": call.created,
        "model": model,
        "choices": [
            {
                "index": ch.index,
                "text": _echo(text, call) + ch.text if req.echo else ch.text,
                "logprobs": _logprobs_text(text, ch.ids, ch.lps, ch.top_ids, ch.top_lps, 0)
                if req.logprobs is not None
                else None,
                "finish_reason": ch.finish,
                "token_ids": ch.ids,
            }
            for ch in call.choices
        ],
        "usage": _usage(call),
        "gyre": _gyre_info(call),
    }
    if req.return_token_ids:
        body["prompt_token_ids"] = call.rendered.prompt_ids
    return body


def _logprobs_chat(
    text: TokenText,
    ids: list[int],
    lps: list[float],
    top_ids: list[list[int]],
    top_lps: list[list[float]],
) -> dict[str, Any]:
    """Chat `logprobs.content`: per token its string, logprob, UTF-8 bytes and `top_logprobs`, the
    engine's k most likely tokens (empty when none were asked for; OpenAI API reference, Chat,
    "logprobs")."""
    content = []
    for i, (t, lp) in enumerate(zip(ids, lps)):
        entry = _token_entry(text, t, lp)
        entry["top_logprobs"] = (
            [_token_entry(text, a, b) for a, b in zip(top_ids[i], top_lps[i])]
            if i < len(top_ids)
            else []
        )
        content.append(entry)
    return {"content": content}


def _token_entry(text: TokenText, token: int, logprob: float) -> dict[str, Any]:
    b = text.token_bytes(token)
    return {"token": b.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(b)}


def _logprobs_text(
    text: TokenText,
    ids: list[int],
    lps: list[float],
    top_ids: list[list[int]],
    top_lps: list[list[float]],
    offset: int,
) -> dict[str, Any]:
    """Completions `logprobs`: tokens, their logprobs, per token a `{token: logprob}` of the
    engine's k most likely tokens (`logprobs: k`; with k = 0 the sampled token alone, as vLLM
    answers), and each token's character offset in the text."""
    tokens = [text.token_str(t) for t in ids]
    offsets = []
    for s in tokens:
        offsets.append(offset)
        offset += len(s)
    tops = []
    for i, (s, lp) in enumerate(zip(tokens, lps)):
        if i < len(top_ids) and top_ids[i]:
            tops.append({text.token_str(a): b for a, b in zip(top_ids[i], top_lps[i])})
        else:
            tops.append({s: lp})
    return {
        "tokens": tokens,
        "token_logprobs": list(lps),
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def _echo(text: TokenText, call: Call) -> str:
    """`echo: true`: the prompt's text, put before each choice's text (OpenAI API reference,
    Completions, "echo")."""
    raw = b"".join(text.token_bytes(t) for t in call.rendered.prompt_ids)
    return raw.decode("utf-8", errors="replace")


def _usage(call: Call) -> dict[str, int]:
    p = len(call.rendered.prompt_ids)
    c = sum(len(ch.ids) for ch in call.choices)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _gyre_info(call: Call) -> dict[str, Any]:
    r = call.rendered
    return {
        "execution_id": call.execution.execution_id,
        "call_id": call.call_id,
        "parent_call_id": None if r.parent is None else r.parent.call_id,
        "divergence": None if r.divergence is None else msgspec.to_builtins(r.divergence),
    }


def _chunk(call: Call, model: str, choices: list[dict[str, Any]], **extra: Any) -> bytes:
    body = {
        "id": f"chatcmpl-{call.request_id}",
        "object": "chat.completion.chunk",
        "created": call.created,
        "model": model,
        "choices": choices,
        **extra,
    }
    return b"data: " + JSON_ENCODER.encode(body) + b"\n\n"


def stream_text(call: Call, ch: Choice) -> tuple[str, str]:
    """(reasoning, content) of a choice still generating that is newly safe to stream: prefixes
    of its final parse, never taken back (`ch.emitted_*` count them; the rest is sent from
    `reply_message` when the choice ends). Every streamed chat-like API uses it."""
    if ch.stream is None:
        ch.stream = (call.reply_parser or _GYRE_PARSER).stream(tools=call.parse_tools)
    r, c = ch.stream.feed(ch.release_text(call.stops))
    ch.emitted_reasoning += len(r)
    ch.emitted_content += len(c)
    return r, c


async def chat_stream(
    call: Call,
    req: ChatCompletionRequest,
    events: AsyncIterator[tuple[Choice, int]],
    *,
    text: TokenText,
    model: str,
    recorder: Recorder,
) -> AsyncGenerator[bytes, None]:
    """SSE chunks: every engine delta becomes one chunk carrying its token IDs and logprobs,
    even when it adds no text (B04); tool calls are sent whole when their choice ends."""
    started = set()
    try:
        first = True
        async for ch, start in events:
            new_ids, new_lps = ch.ids[start:], ch.lps[start:]
            delta: dict[str, Any] = {}
            if ch.index not in started:
                started.add(ch.index)
                delta["role"] = "assistant"
            if ch.finish is None:
                r, c = stream_text(call, ch)
                if r:
                    delta["reasoning_content"] = r
                if c:
                    delta["content"] = c
                finish = None
            else:
                msg, _ = reply_message(call, ch)
                r = msg.get("reasoning_content") or ""
                c = msg.get("content") or ""
                if r[ch.emitted_reasoning :]:
                    delta["reasoning_content"] = r[ch.emitted_reasoning :]
                if c[ch.emitted_content :]:
                    delta["content"] = c[ch.emitted_content :]
                elif msg["content"] == "" and not ch.emitted_content:
                    delta["content"] = ""  # as the whole answer has it: "" is not null
                if msg.get("tool_calls"):
                    delta["tool_calls"] = [
                        dict(tc, index=i) for i, tc in enumerate(msg["tool_calls"])
                    ]
                if "gyre_tool_call_error" in msg:
                    delta["gyre_tool_call_error"] = msg["gyre_tool_call_error"]
                finish = "tool_calls" if msg.get("tool_calls") else ch.finish
            choice: dict[str, Any] = {
                "index": ch.index,
                "delta": delta,
                "logprobs": _logprobs_chat(
                    text, new_ids, new_lps, ch.top_ids[start:], ch.top_lps[start:]
                )
                if req.logprobs
                else None,
                "finish_reason": finish,
            }
            choice["token_ids"] = new_ids
            extra = (
                {"prompt_token_ids": call.rendered.prompt_ids}
                if first and req.return_token_ids
                else {}
            )
            first = False
            yield _chunk(call, model, [choice], **extra)
        replies = [chat_reply(call, ch) for ch in call.choices]
        await recorder.record(call, replies)
        if req.stream_options is not None and req.stream_options.include_usage:
            yield _chunk(call, model, [], usage=_usage(call), gyre=_gyre_info(call))
        yield b"data: [DONE]\n\n"
    except EngineError as exc:
        if not started:
            raise
        await recorder.record_partial(call, chat_reply)
        yield _sse_error(exc)
    finally:
        await recorder.record_partial(call, chat_reply)


async def completion_stream(
    call: Call,
    req: CompletionRequest,
    events: AsyncIterator[tuple[Choice, int]],
    *,
    text: TokenText,
    model: str,
    recorder: Recorder,
) -> AsyncGenerator[bytes, None]:
    """SSE chunks of a completions call: every engine delta becomes one chunk with its token IDs."""
    started = False
    try:
        first = True
        for_offsets = {ch.index: 0 for ch in call.choices}
        echo = {ch.index: _echo(text, call) for ch in call.choices} if req.echo else {}
        async for ch, start in events:
            started = True
            new_ids, new_lps = ch.ids[start:], ch.lps[start:]
            if ch.finish is not None:
                piece = ch.text[ch.emitted_content :]
            else:
                piece = ch.release_text(call.stops)
            ch.emitted_content += len(piece)
            choice = {
                "index": ch.index,
                "text": echo.pop(ch.index, "") + piece,
                "logprobs": _logprobs_text(
                    text,
                    new_ids,
                    new_lps,
                    ch.top_ids[start:],
                    ch.top_lps[start:],
                    for_offsets[ch.index],
                )
                if req.logprobs is not None
                else None,
                "finish_reason": ch.finish,
            }
            for_offsets[ch.index] += sum(len(text.token_str(t)) for t in new_ids)
            choice["token_ids"] = new_ids
            extra = (
                {"prompt_token_ids": call.rendered.prompt_ids}
                if first and req.return_token_ids
                else {}
            )
            first = False
            body = {
                "id": f"cmpl-{call.request_id}",
                "object": "text_completion",
                "created": call.created,
                "model": model,
                "choices": [choice],
                **extra,
            }
            yield b"data: " + JSON_ENCODER.encode(body) + b"\n\n"
        await recorder.record(call, [None] * len(call.choices))
        if req.stream_options is not None and req.stream_options.include_usage:
            body = {
                "id": f"cmpl-{call.request_id}",
                "object": "text_completion",
                "created": call.created,
                "model": model,
                "choices": [],
                "usage": _usage(call),
            }
            yield b"data: " + JSON_ENCODER.encode(body) + b"\n\n"
        yield b"data: [DONE]\n\n"
    except EngineError as exc:
        if not started:
            raise
        await recorder.record_partial(call, None)
        yield _sse_error(exc)
    finally:
        await recorder.record_partial(call, None)


def _sse_error(exc: Exception) -> bytes:
    """An error event that ends a stream whose 200 status line was already sent."""
    code = getattr(exc, "code", None)
    return (
        b"data: " + error_body(str(exc), type="server_error", code=code) + b"\n\ndata: [DONE]\n\n"
    )
