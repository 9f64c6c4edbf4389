"""Anthropic's Messages format of one model call: the `message` body, its events, errors.

Owns `message_body` (a finished call's `message`: content blocks [thinking?, text?, tool_use...],
stop reason, usage and the `gyre` block with the completion's token IDs), `message_stream` (the
events `message_start`, `ping`, `content_block_start` / `_delta` / `_stop`, `message_delta`,
`message_stop`; the call is recorded before `message_delta`) and `anthropic_error` (the error body).
Protocol reference: the Anthropic API reference ("Messages", "Streaming Messages", "Errors") and
the `anthropic` SDK's types. The request side is `messages_api`. Knows nothing about routes, keys
or engines.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import msgspec

from gyre.errors import EngineError
from gyre.tito.detok import TokenText
from gyre.tito.generation import Call, Choice
from gyre.tito.openai_format import chat_reply, reply_message, stream_text
from gyre.tito.recorder import Recorder
from gyre.tito.reply import THINK_OPEN
from gyre.tito.wire import JSON_ENCODER

__all__ = ["anthropic_error", "message_body", "message_stream"]

_ERROR_TYPES = {
    "authentication_error": "authentication_error",
    "permission_error": "permission_error",
    "invalid_request_error": "invalid_request_error",
}
_ERROR_CODES = {
    "model_not_found": "not_found_error",
    "not_found": "not_found_error",
    "request_too_large": "request_too_large",
    "engine_unavailable": "overloaded_error",
}


def anthropic_error(message: str, *, type: str, code: str | None, param: str | None) -> bytes:
    """`{"type": "error", "error": {"type", "message"}}` (Anthropic API reference, "Errors");
    gyre's error `type` and `code` pick the Anthropic type (`api_error` for a server error)."""
    kind = _ERROR_CODES.get(code or "") or _ERROR_TYPES.get(type, "api_error")
    return JSON_ENCODER.encode({"type": "error", "error": {"type": kind, "message": message}})


def _stop(call: Call, ch: Choice, text: TokenText, tool_use: bool) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence) of a finished choice."""
    if tool_use:
        return "tool_use", None
    if ch.finish == "length":
        return "max_tokens", None
    if ch.stop_string:  # the visible text ends where the stop sequence began
        full, at = text.decode(ch.ids), len(ch.text)
        hits = [s for s in call.stops if full.startswith(s, at)]
        return "stop_sequence", min(hits, key=len) if hits else None
    return ("end_turn" if ch.finish == "stop" else None), None


def _gyre(call: Call, ch: Choice, msg: dict[str, Any]) -> dict[str, Any]:
    """The `gyre` block: where the call was recorded and its exact completion token IDs."""
    r = call.rendered
    out = {
        "execution_id": call.execution.execution_id,
        "call_id": call.call_id,
        "parent_call_id": None if r.parent is None else r.parent.call_id,
        "divergence": None if r.divergence is None else msgspec.to_builtins(r.divergence),
        "token_ids": ch.ids,
    }
    if "gyre_tool_call_error" in msg:
        out["tool_call_error"] = msg["gyre_tool_call_error"]
    return out


def _tool_use(tc: dict[str, Any]) -> dict[str, Any]:
    fn = tc["function"]
    args = fn["arguments"]
    return {
        "type": "tool_use",
        "id": tc["id"],
        "name": fn["name"],
        "input": json.loads(args) if isinstance(args, str) else args,
    }


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + JSON_ENCODER.encode(data) + b"\n\n"


class _Blocks:
    """The content blocks of one streamed reply: thinking, then text, then tool_use, each
    started, filled by deltas and stopped in turn."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None
        self.thought = False
        self.head = ""
        """The first characters of the visible text (does it open a thinking block?)."""

    def start(self, block: dict[str, Any]) -> list[bytes]:
        out = self.stop()
        self.index += 1
        self.open = block["type"]
        return out + [
            _sse(
                "content_block_start",
                {"type": "content_block_start", "index": self.index, "content_block": block},
            )
        ]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _sse(
            "content_block_delta",
            {"type": "content_block_delta", "index": self.index, "delta": delta},
        )

    def stop(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [_sse("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def thinking(self, piece: str, *, present: bool = False) -> list[bytes]:
        out: list[bytes] = []
        if (piece or present) and not self.thought:
            self.thought = True
            out += self.start({"type": "thinking", "thinking": "", "signature": ""})
        if piece:
            out.append(self._delta({"type": "thinking_delta", "thinking": piece}))
        return out

    def text(self, piece: str) -> list[bytes]:
        if not piece:
            return []
        out: list[bytes] = []
        if self.open != "text":
            if self.head.startswith(THINK_OPEN):  # an empty thinking block still comes first
                out += self.thinking("", present=True)
            out += self.start({"type": "text", "text": ""})
        out.append(self._delta({"type": "text_delta", "text": piece}))
        return out

    def tool_use(self, tc: dict[str, Any]) -> list[bytes]:
        fn = tc["function"]
        args = fn["arguments"] if isinstance(fn["arguments"], str) else json.dumps(fn["arguments"])
        block = {"type": "tool_use", "id": tc["id"], "name": fn["name"], "input": {}}
        return self.start(block) + [self._delta({"type": "input_json_delta", "partial_json": args})]


def _message(call: Call, model: str, content: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "id": "msg_" + call.request_id.replace("/", "_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        **extra,
    }


def message_body(call: Call, msg: dict[str, Any], *, text: TokenText, model: str) -> dict[str, Any]:
    """The `message` of a finished one-choice call whose chat reply is `msg` (the OpenAI message
    of `openai_format.reply_message`): content [thinking?, text?, tool_use...] (one empty text
    block when the reply is empty), stop reason, usage (tokens) and the `gyre` block."""
    ch = call.choices[0]
    content: list[dict[str, Any]] = []
    if msg.get("reasoning_content") is not None:
        content.append({"type": "thinking", "thinking": msg["reasoning_content"], "signature": ""})
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    content += [_tool_use(tc) for tc in msg.get("tool_calls") or ()]
    if not content:
        content.append({"type": "text", "text": ""})
    reason, sequence = _stop(call, ch, text, bool(msg.get("tool_calls")))
    return _message(
        call,
        model,
        content,
        stop_reason=reason,
        stop_sequence=sequence,
        usage={"input_tokens": len(call.rendered.prompt_ids), "output_tokens": len(ch.ids)},
        gyre=_gyre(call, ch, msg),
    )


async def message_stream(
    call: Call,
    events: AsyncIterator[tuple[Choice, int]],
    *,
    text: TokenText,
    model: str,
    recorder: Recorder,
) -> AsyncGenerator[bytes, None]:
    """The events of a streamed one-choice call: `message_start` and `ping` with the first
    engine delta, the content blocks (`thinking_delta`, `text_delta` as text is released; each
    tool_use whole, one `input_json_delta`, when the reply ends), then, once the call is recorded,
    `message_delta` (stop reason, usage, the `gyre` block) and `message_stop`. An engine error
    after the first event ends the stream with an `error` event; what was sampled is recorded."""
    blocks = _Blocks()
    started = False
    prompt_len = len(call.rendered.prompt_ids)
    msg: dict[str, Any] = {}

    def start() -> list[bytes]:
        nonlocal started
        if started:
            return []
        started = True
        usage = {"input_tokens": prompt_len, "output_tokens": 0}
        message = _message(call, model, [], stop_reason=None, stop_sequence=None, usage=usage)
        return [
            _sse("message_start", {"type": "message_start", "message": message}),
            _sse("ping", {"type": "ping"}),
        ]

    try:
        async for ch, _ in events:
            out = start()
            if ch.finish is None:
                piece_r, piece_c = stream_text(call, ch)
                if len(blocks.head) < len(THINK_OPEN):
                    blocks.head = ch.text[: len(THINK_OPEN)]
                out += blocks.thinking(piece_r)
                out += blocks.text(piece_c)
            else:
                msg, _ = reply_message(call, ch)
                reasoning = msg.get("reasoning_content")
                if reasoning is not None:
                    out += blocks.thinking(reasoning[ch.emitted_reasoning :], present=True)
                out += blocks.text((msg.get("content") or "")[ch.emitted_content :])
                for tc in msg.get("tool_calls") or ():
                    out += blocks.tool_use(tc)
                if blocks.index < 0:
                    out += blocks.start({"type": "text", "text": ""})
                out += blocks.stop()
            if out:
                yield b"".join(out)
        head = start()
        ch = call.choices[0]
        await recorder.record(call, [chat_reply(call, c) for c in call.choices])
        reason, sequence = _stop(call, ch, text, bool(msg.get("tool_calls")))
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": {"input_tokens": prompt_len, "output_tokens": len(ch.ids)},
            "gyre": _gyre(call, ch, msg),
        }
        yield b"".join(
            head + [_sse("message_delta", delta), _sse("message_stop", {"type": "message_stop"})]
        )
    except EngineError as exc:
        if not started:
            raise
        await recorder.record_partial(call, chat_reply)
        body = anthropic_error(str(exc), type="server_error", code=exc.code, param=None)
        yield _sse("error", msgspec.json.decode(body))
    finally:
        await recorder.record_partial(call, chat_reply)
