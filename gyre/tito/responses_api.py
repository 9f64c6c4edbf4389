"""The OpenAI Responses API (`POST /v1/responses`) as a chat call: `ResponsesApi`.

A Responses request (`input` items, `instructions`, flat function `tools`, `text.format`,
`previous_response_id`, ...) is decoded into the `ChatCompletionRequest` it means, so it is
rendered, generated and recorded exactly like a Chat Completions call (`chat_api.ChatApi`). The
answer is that call's chat completion translated into a `response` object (a `reasoning` item, a
`message` item, `function_call` items); a stream is the chat path's own SSE chunks
(`openai_format.chat_stream`, which records the call before its usage chunk) translated into
Responses events, so the recording and reply-streaming logic exist once. Response chains
(`previous_response_id`) are held per open execution and dropped by `forget` when it closes;
a stateless client's reasoning comes back sealed in `encrypted_content` (`reasoning_seal`).
Protocol: OpenAI's API reference for Responses, as typed by the official SDK
(`openai.types.responses`) and vLLM (`vllm/entrypoints/openai/responses/protocol.py`). Knows
nothing about routes, keys or engines.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from functools import partial
from typing import Any

import anyio
import msgspec

from gyre.tito.chat_api import Reply
from gyre.tito.detok import TokenText
from gyre.tito.generation import Call, Choice
from gyre.tito.openai_format import chat_completion, chat_stream, reply_message
from gyre.tito.reasoning_seal import ReasoningSeal, SealError
from gyre.tito.recorder import Recorder
from gyre.tito.responses_input import (
    ResponsesCall,
    bad_request,
    chat_request,
    decode_responses,
    input_messages,
)
from gyre.tito.sessions import Execution
from gyre.tito.wire import JSON_ENCODER, ChatCompletionRequest, ChatMessage, error_body

__all__ = ["ResponsesApi", "response_id", "output_items"]

_UNSAFE_ID = re.compile(r"[^A-Za-z0-9_-]")


class _Link:
    """One stored response of a chain: the messages it added (its input and its reply) and the
    response it continued. A chain of n responses holds each message once (memory linear in the
    conversation, not n copies of it)."""

    __slots__ = ("parent", "messages")

    def __init__(self, parent: _Link | None, messages: tuple[ChatMessage, ...]) -> None:
        self.parent, self.messages = parent, messages

    def history(self) -> list[ChatMessage]:
        """The whole conversation up to and including this response's reply, oldest first."""
        parts: list[tuple[ChatMessage, ...]] = []
        link: _Link | None = self
        while link is not None:
            parts.append(link.messages)
            link = link.parent
        return [m for part in reversed(parts) for m in part]


class ResponsesApi:
    """OpenAI Responses (`POST /v1/responses`), served through the chat path (the request
    mapping: `responses_input.chat_request`). `previous_response_id` names a stored response of
    the same open execution (its conversation and reply); an unknown one, or one created with
    `store: false`, is a 400. A stateless client instead sends the output items back as input:
    with `include: ["reasoning.encrypted_content"]` each reasoning item carries its text sealed
    to the execution (`ReasoningSeal`), which restores it exactly when the item comes back
    without its text; a seal that does not open is a 400 naming it.

    Args:
        text: the proxy's `TokenText` (logprob token strings).
        model: the served model name written into responses.
        seal: the `ReasoningSeal` of `encrypted_content` (None: a new one, its own random key).
    """

    def __init__(self, *, text: TokenText, model: str, seal: ReasoningSeal | None = None) -> None:
        self.text, self.model = text, model
        self.seal = ReasoningSeal() if seal is None else seal
        self._chains: dict[str, dict[str, _Link]] = {}

    # -- requests ------------------------------------------------------------------------------

    def decode(self, body: bytes, ex: Execution) -> tuple[ResponsesCall, ChatCompletionRequest]:
        req = decode_responses(body)
        history: list[ChatMessage] = []
        link = None
        if req.previous_response_id is not None:
            link = self._chains.get(ex.execution_id, {}).get(req.previous_response_id)
            if link is None:
                raise bad_request(
                    f"previous_response_id {req.previous_response_id!r} names no stored response "
                    "of this execution (a response created with store: false is not kept: send "
                    "its output items back as input instead)",
                    "previous_response_id",
                    "previous_response_not_found",
                )
            history = link.history()

        def unseal(sealed: str, param: str) -> str:
            try:
                return self.seal.open(sealed, ex.execution_id)[1]
            except SealError as exc:
                raise bad_request(f"{param} {exc}", param, "invalid_encrypted_content") from None

        new = input_messages(req.input, unseal, history)
        chat = chat_request(req, history + new)
        return ResponsesCall(req, chat, link, tuple(new)), chat

    def forget(self, execution_id: str) -> None:
        """Drop the response chains of a closed execution."""
        self._chains.pop(execution_id, None)

    def keep(self, call: Call, rc: ResponsesCall, reply: ChatMessage) -> None:
        """Keep a response's conversation (with its reply) for `previous_response_id`."""
        if rc.request.store and not call.execution.closed:
            chains = self._chains.setdefault(call.execution.execution_id, {})
            chains[response_id(call)] = _Link(rc.link, (*rc.new, reply))

    # -- responses ------------------------------------------------------------------------------

    def answer(self, call: Call, native: ResponsesCall, replies: list[Reply]) -> bytes:
        self.keep(call, native, replies[0][1])
        return JSON_ENCODER.encode(self.response(call, native, replies))

    def response(self, call: Call, rc: ResponsesCall, replies: list[Reply]) -> dict[str, Any]:
        """The `response` object of a finished call (one choice), from its chat completion."""
        chat = chat_completion(call, rc.chat, replies, text=self.text, model=self.model)
        choice = chat["choices"][0]
        msg, ch = choice["message"], call.choices[0]
        lps = choice["logprobs"]["content"] if choice["logprobs"] else None
        output = output_items(response_id(call), msg, lps, partial(self.reasoning, call, rc))
        incomplete = ch.finish == "length"
        req = rc.request
        body: dict[str, Any] = {
            "id": response_id(call),
            "object": "response",
            "created_at": call.created,
            "status": "incomplete" if incomplete else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "error": None,
            "model": self.model,
            "instructions": req.instructions,
            "output": output,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "tool_choice": req.tool_choice or "auto",
            "tools": req.tools or [],
            "temperature": req.temperature,
            "top_p": req.top_p,
            "max_output_tokens": req.max_output_tokens,
            "previous_response_id": req.previous_response_id,
            "reasoning": None if req.reasoning is None else msgspec.to_builtins(req.reasoning),
            "text": {"format": (req.text and req.text.format) or {"type": "text"}},
            "store": req.store,
            "metadata": req.metadata or {},
            "usage": {
                "input_tokens": chat["usage"]["prompt_tokens"],
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": chat["usage"]["completion_tokens"],
                "output_tokens_details": {
                    "reasoning_tokens": reasoning_tokens(
                        self.text, ch, msg.get("reasoning_content")
                    )
                },
                "total_tokens": chat["usage"]["total_tokens"],
            },
            "token_ids": choice["token_ids"],
            "gyre": chat["gyre"],
        }
        if "prompt_token_ids" in chat:
            body["prompt_token_ids"] = chat["prompt_token_ids"]
        if "gyre_tool_call_error" in msg:
            body["gyre_tool_call_error"] = msg["gyre_tool_call_error"]
        return body

    def stream(
        self,
        call: Call,
        native: ResponsesCall,
        events: AsyncIterator[tuple[Choice, int]],
        recorder: Recorder,
    ) -> AsyncGenerator[bytes, None]:
        chunks = chat_stream(
            call, native.chat, events, text=self.text, model=self.model, recorder=recorder
        )
        return _ResponseEvents(self, call, native).translate(chunks)

    def error_body(self, message: str, *, type: str, code: str | None, param: str | None) -> bytes:
        return error_body(message, type=type, code=code, param=param)

    def reasoning(self, call: Call, rc: ResponsesCall, text: str) -> dict[str, Any]:
        """The finished `reasoning` item of `call`: its text as content; as its summary too when
        `reasoning.summary` asks for one (auto or detailed: the text is the most detailed
        summary there is); and its `encrypted_content` when `include` asks for it."""
        base = response_id(call)
        item = reasoning_item(base, text)
        req = rc.request
        if req.reasoning is not None and req.reasoning.summarized and text:
            item["summary"] = [{"type": "summary_text", "text": text}]
        if "reasoning.encrypted_content" in (req.include or ()):
            item["encrypted_content"] = self.seal.seal(call.execution.execution_id, base, text)
        return item


def response_id(call: Call) -> str:
    """`resp_<execution>_<call>`: unique across the proxy's executions."""
    return "resp_" + _UNSAFE_ID.sub("_", f"{call.execution.execution_id}_{call.call_id}")


def output_items(
    base: str,
    msg: dict[str, Any],
    logprobs: list[dict[str, Any]] | None,
    reasoning: Callable[[str], dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The output items of an assistant message (`openai_format.reply_message`'s JSON): a
    `reasoning` item (`reasoning(text)`, by default `reasoning_item`: its text as
    `reasoning_text` content), a `message` item unless the reply is only tool calls, then one
    `function_call` item per call. `logprobs` (every completion token's, reasoning and tool
    calls included) go on the `output_text` part."""
    items: list[dict[str, Any]] = []
    if msg.get("reasoning_content") is not None:
        text = msg["reasoning_content"]
        items.append(reasoning_item(base, text) if reasoning is None else reasoning(text))
    if msg.get("content") is not None:
        part: dict[str, Any] = {"type": "output_text", "text": msg["content"], "annotations": []}
        if logprobs is not None:
            part["logprobs"] = logprobs
        items.append(message_item(base, [part]))
    for i, tc in enumerate(msg.get("tool_calls") or ()):
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{base.removeprefix('resp_')}_{i}",
                "call_id": tc["id"],
                "name": tc["function"]["name"],
                "arguments": tc["function"]["arguments"],
                "status": "completed",
            }
        )
    return items


def reasoning_item(base: str, text: str | None, status: str = "completed") -> dict[str, Any]:
    """The Responses API `reasoning` output item of response `base` (`resp_...`): its text as
    one `reasoning_text` part (none when `text` is None)."""
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {
        "type": "reasoning",
        "id": f"rs_{base.removeprefix('resp_')}",
        "summary": [],
        "content": content,
        "status": status,
    }


def message_item(base: str, content: list, status: str = "completed") -> dict[str, Any]:
    """The Responses API assistant `message` output item of response `base` with `content`
    parts (`output_text`)."""
    return {
        "type": "message",
        "id": f"msg_{base.removeprefix('resp_')}",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def reasoning_tokens(text: TokenText, ch: Choice, reasoning: str | None) -> int:
    """Completion tokens up to the one that completes the reasoning text (0 without one)."""
    if not reasoning:
        return 0
    decoded = text.decode(ch.ids)
    at = decoded.find(reasoning)
    if at < 0:
        return 0
    end, n = at + len(reasoning), 0
    dec = text.stream()
    for i, t in enumerate(ch.ids):
        n += len(dec.push(t))
        if n >= end:
            return i + 1
    return len(ch.ids)


def _event(kind: str, seq: int, **fields: Any) -> bytes:
    body = JSON_ENCODER.encode({"type": kind, "sequence_number": seq, **fields})
    return b"event: " + kind.encode() + b"\ndata: " + body + b"\n\n"


_CHUNK_DECODER = msgspec.json.Decoder()


class _ResponseEvents:
    """One streamed response: chat chunks in, Responses events out (`sequence_number` 0, 1, ...).

    Items open as their text starts (reasoning, then the message) and are completed from the
    final reply when the choice finishes; `response.completed` (or `.incomplete`) is sent on the
    chat stream's usage chunk, which comes after the call is recorded."""

    def __init__(self, api: ResponsesApi, call: Call, rc: ResponsesCall) -> None:
        self.api, self.call, self.rc = api, call, rc
        self.base = response_id(call)
        self.seq = 0
        self.opened: dict[str, int] = {}
        """Item type -> output index, for the reasoning and message items streamed so far."""
        self.closed: set[str] = set()
        self.final: dict[str, Any] | None = None

    def _emit(self, kind: str, **fields: Any) -> bytes:
        out = _event(kind, self.seq, **fields)
        self.seq += 1
        return out

    def _shell(self, status: str) -> dict[str, Any]:
        """The response object before its output exists."""
        req = self.rc.request
        return {
            "id": self.base,
            "object": "response",
            "created_at": self.call.created,
            "status": status,
            "model": self.api.model,
            "instructions": req.instructions,
            "output": [],
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "tool_choice": req.tool_choice or "auto",
            "tools": req.tools or [],
            "previous_response_id": req.previous_response_id,
            "metadata": req.metadata or {},
            "usage": None,
        }

    async def translate(self, chunks: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
        """The Responses API events for the chat stream `chunks`. Closes `chunks` however it
        ends, under a shield: the chat stream's own cleanup (recording what was sampled) must
        run inside the request, not later in a finalizer after the call has left `InFlight`."""
        try:
            started = False
            async for piece in chunks:
                out: list[bytes] = []
                for line in piece.split(b"\n\n"):
                    data = line.removeprefix(b"data: ")
                    if not data or data == b"[DONE]":
                        continue
                    chunk = _CHUNK_DECODER.decode(data)
                    if "error" in chunk:
                        err = chunk["error"]
                        out.append(
                            self._emit(
                                "error",
                                code=err.get("code"),
                                message=err["message"],
                                param=None,
                                error=err,
                            )
                        )
                        continue
                    if not started:
                        started = True
                        out.append(
                            self._emit("response.created", response=self._shell("in_progress"))
                        )
                        out.append(
                            self._emit("response.in_progress", response=self._shell("in_progress"))
                        )
                    if chunk["choices"]:
                        out += self._delta(chunk["choices"][0])
                    else:  # the usage chunk: the call is recorded
                        out += self._finish()
                if out:
                    yield b"".join(out)
        finally:
            with anyio.CancelScope(shield=True):
                await chunks.aclose()

    def _open(self, kind: str) -> list[bytes]:
        """`output_item.added` and `content_part.added` of the next item (reasoning or message:
        they come before any function call)."""
        index = len(self.opened)
        self.opened[kind] = index
        part: dict[str, Any]
        if kind == "reasoning":
            item = reasoning_item(self.base, None, "in_progress")
            part = {"type": "reasoning_text", "text": ""}
        else:
            item = message_item(self.base, [], "in_progress")
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            self._emit("response.output_item.added", output_index=index, item=item),
            self._emit(
                "response.content_part.added",
                output_index=index,
                item_id=item["id"],
                content_index=0,
                part=part,
            ),
        ]

    def _delta(self, choice: dict[str, Any]) -> list[bytes]:
        delta, out = choice["delta"], []
        if delta.get("reasoning_content"):
            if "reasoning" not in self.opened:
                out += self._open("reasoning")
            out.append(
                self._emit(
                    "response.reasoning_text.delta",
                    output_index=self.opened["reasoning"],
                    item_id=f"rs_{self.base.removeprefix('resp_')}",
                    content_index=0,
                    delta=delta["reasoning_content"],
                )
            )
        if delta.get("content"):
            if "message" not in self.opened:
                # The reasoning is complete once content flows: its item comes first.
                reasoning = reply_message(self.call, self.call.choices[0])[0].get(
                    "reasoning_content"
                )
                if reasoning is not None:
                    if "reasoning" not in self.opened:
                        out += self._open("reasoning")
                    item = self.api.reasoning(self.call, self.rc, reasoning)
                    out += self._close_opened([item], "reasoning")
                out += self._open("message")
            out.append(
                self._emit(
                    "response.output_text.delta",
                    output_index=self.opened["message"],
                    item_id=f"msg_{self.base.removeprefix('resp_')}",
                    content_index=0,
                    delta=delta["content"],
                    logprobs=[],
                )
            )
        if choice["finish_reason"] is not None:
            out += self._complete_items()
        return out

    def _final_items(self) -> list[dict[str, Any]]:
        if self.final is None:
            replies = [reply_message(self.call, self.call.choices[0])]
            self.final = self.api.response(self.call, self.rc, replies)
        return self.final["output"]

    def _close_opened(self, items: list[dict[str, Any]], only: str) -> list[bytes]:
        """The done events of the streamed item `only` ("reasoning" or "message")."""
        if only in self.closed:
            return []
        self.closed.add(only)
        item = next((it for it in items if it["type"] == only), None)
        if item is None:  # what was streamed became part of another item (cannot happen)
            raise AssertionError(f"streamed {only} item missing from the final reply")
        index, out = self.opened[only], []
        if only == "reasoning":
            text = item["content"][0]["text"] if item["content"] else ""
            out.append(
                self._emit(
                    "response.reasoning_text.done",
                    output_index=index,
                    item_id=item["id"],
                    content_index=0,
                    text=text,
                )
            )
        else:
            part = item["content"][0]
            out.append(
                self._emit(
                    "response.output_text.done",
                    output_index=index,
                    item_id=item["id"],
                    content_index=0,
                    text=part["text"],
                    logprobs=part.get("logprobs", []),
                )
            )
        part = item["content"][0] if item["content"] else {"type": "reasoning_text", "text": ""}
        out.append(
            self._emit(
                "response.content_part.done",
                output_index=index,
                item_id=item["id"],
                content_index=0,
                part=part,
            )
        )
        for i, summary in enumerate(item.get("summary") or ()):  # whole: the text just streamed
            at = {"output_index": index, "item_id": item["id"], "summary_index": i}
            added = {"type": "summary_text", "text": ""}
            out.append(self._emit("response.reasoning_summary_part.added", part=added, **at))
            out.append(
                self._emit("response.reasoning_summary_text.delta", delta=summary["text"], **at)
            )
            out.append(
                self._emit("response.reasoning_summary_text.done", text=summary["text"], **at)
            )
            out.append(self._emit("response.reasoning_summary_part.done", part=summary, **at))
        out.append(self._emit("response.output_item.done", output_index=index, item=item))
        return out

    def _complete_items(self) -> list[bytes]:
        """At the choice's finish: close the streamed items, send the others whole."""
        items, out = self._final_items(), []
        for index, item in enumerate(items):
            kind = item["type"]
            if kind in self.opened:
                assert self.opened[kind] == index, (kind, index)
                out += self._close_opened(items, only=kind)
                continue
            if kind == "function_call":
                out.append(
                    self._emit(
                        "response.output_item.added",
                        output_index=index,
                        item=dict(item, arguments="", status="in_progress"),
                    )
                )
                for name, extra in (
                    ("delta", {"delta": item["arguments"]}),
                    ("done", {"arguments": item["arguments"], "name": item["name"]}),
                ):
                    out.append(
                        self._emit(
                            f"response.function_call_arguments.{name}",
                            output_index=index,
                            item_id=item["id"],
                            **extra,
                        )
                    )
                out.append(self._emit("response.output_item.done", output_index=index, item=item))
                continue
            assert len(self.opened) == index, (kind, index)
            out += self._open(kind)  # an item with no text streamed before the finish
            out += self._close_opened(items, only=kind)
        return out

    def _finish(self) -> list[bytes]:
        """`response.completed` (or `.incomplete` after `max_output_tokens`), once recorded."""
        self._final_items()
        body = self.final
        assert body is not None
        reply = reply_message(self.call, self.call.choices[0])[1]
        self.api.keep(self.call, self.rc, reply)
        kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        return [self._emit(kind, response=body)]
