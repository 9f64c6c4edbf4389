"""OpenAI's format: requests in, responses and server-sent events out, for one model call.

Owns the request checks and their translation (`decode_request`, `check_model`, `check_messages`,
`completion_prompt`, `sampling_params`, `stop_strings`, `proxy_error`), the assistant message of a
choice (`reply_message`), response bodies (`chat_completion`, `text_completion`: logprobs, usage,
the `gyre` block) and the SSE streams (`chat_stream`, `completion_stream`, which have the
`Recorder` record the call before their last chunk). Every choice carries its `token_ids`;
`return_token_ids: true` (vLLM's flag) adds `prompt_token_ids`. Knows nothing about routes, API
keys or how the engine is driven.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from gyre.config import ProxyConfig
from gyre.engines.protocol import InferenceEngine, SamplingParams, StructuredOutput
from gyre.errors import EngineError, ProxyError
from gyre.tito.detok import TokenText
from gyre.tito.generation import Call, Choice
from gyre.tito.model_format import GyreParser
from gyre.tito.recorder import Recorder
from gyre.tito.sessions import Execution
from gyre.tito.wire import (
    JSON_ENCODER,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    error_body,
    message_text,
)

__all__ = [
    "proxy_error",
    "decode_request",
    "check_model",
    "check_messages",
    "completion_prompt",
    "sampling_params",
    "stop_strings",
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


def proxy_error(
    message: str,
    status: int,
    code: str | None,
    *,
    param: str | None = None,
    type: str | None = None,
) -> ProxyError:
    """A `ProxyError` answered in OpenAI's error shape (`status`, `code`, `param`, `type`)."""
    return ProxyError(message, status=status, type=type, error_code=code, param=param)


def _param_of(message: str) -> str | None:
    """The JSON path msgspec names in a validation error (`... - at `$.messages[0].role``)."""
    _, sep, path = message.rpartition("at `")
    return path.rstrip("`").removeprefix("$.") if sep else None


def decode_request(decoder: msgspec.json.Decoder, body: bytes) -> Any:
    """The request `body` decoded and validated by `decoder` (400 naming the offending field)."""
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise proxy_error(
            f"invalid request: {exc}", 400, "invalid_type", param=_param_of(str(exc))
        ) from None
    except msgspec.DecodeError as exc:
        raise proxy_error(f"malformed JSON body: {exc}", 400, "invalid_json") from None


def check_model(model: str, served: tuple[str, ...]) -> None:
    """404 unless the request names a served model name."""
    if model not in served:
        raise proxy_error(
            f"the model {model!r} does not exist (served: {', '.join(map(repr, served))})",
            404,
            "model_not_found",
            param="model",
            type="invalid_request_error",
        )


_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
"""Chat roles of OpenAI's API reference (Chat, "messages"); `function` (deprecated) is not."""


def check_messages(messages: list[ChatMessage]) -> None:
    """400 for a history that would go into training data malformed: an empty conversation, a
    content that is not text, an unknown role, a `tool` message without `tool_call_id` or whose
    `tool_call_id` names no tool call of an earlier assistant message (an orphan)."""
    if not messages:
        raise proxy_error("messages must not be empty", 400, "invalid_value", param="messages")
    called: set[str] = set()
    for i, m in enumerate(messages):
        try:
            message_text(m.content)
        except ValueError as exc:
            raise proxy_error(str(exc), 400, "invalid_value", param=f"messages[{i}]") from None
        if m.role not in _ROLES:
            raise proxy_error(
                f"messages[{i}].role={m.role!r} must be one of {', '.join(sorted(_ROLES))}",
                400,
                "invalid_value",
                param=f"messages[{i}].role",
            )
        if m.role == "assistant":
            called.update(tc.id for tc in m.tool_calls or () if tc.id is not None)
        elif m.role == "tool":
            if m.tool_call_id is None:
                raise proxy_error(
                    f"messages[{i}] (role tool) needs a tool_call_id",
                    400,
                    "invalid_value",
                    param=f"messages[{i}].tool_call_id",
                )
            if m.tool_call_id not in called:
                raise proxy_error(
                    f"messages[{i}].tool_call_id={m.tool_call_id!r} answers no tool call of an "
                    "earlier assistant message",
                    400,
                    "invalid_value",
                    param=f"messages[{i}].tool_call_id",
                )


def completion_prompt(prompt: str | list[Any]) -> str | list[int]:
    """The one prompt of a completions request: a string or a list of token IDs (a batch of one
    is unwrapped; more than one is refused)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise proxy_error(
                "one prompt per request is supported", 400, "invalid_value", param="prompt"
            )
        prompt = prompt[0]
    if isinstance(prompt, list) and not all(type(t) is int for t in prompt):
        raise proxy_error(
            "prompt must be a string or a list of token IDs", 400, "invalid_type", param="prompt"
        )
    return prompt


def sampling_params(
    req: ChatCompletionRequest | CompletionRequest,
    max_tokens: int | None,
    prompt_len: int,
    ex: Execution,
    engine: InferenceEngine,
    *,
    config: ProxyConfig,
    stop_token_ids: tuple[int, ...],
    structured: StructuredOutput | None = None,
) -> SamplingParams:
    """Sampling params with the context limit applied (B15): clamp or refuse, never a crash.

    A refusal marks `ex` truncated and counts it; `stop_token_ids` (the tokenizer's EOS) come
    before the request's own; `structured` is the reply's grammar (`constraints.chat_constraint`).

    Every parameter that changes what is sampled is passed to the engine or refused with a 400,
    never dropped. `logit_bias` and the presence, frequency and repetition penalties are passed
    to the engine and recorded with the call (`ModelCall.sampling`); the behaviour logprobs are
    those of the distribution they produce (vLLM's processed logprobs, invariant 2), so the
    trainer's importance ratio pi_theta / pi_behaviour accounts for them like any off-policy
    sample. Ranges are OpenAI's (API reference, Chat and Completions): biases in [-100, 100] on
    token IDs of the vocabulary, presence and frequency penalties in [-2, 2], `top_logprobs` (chat,
    needs `logprobs: true`) and completions' `logprobs` in [0, 20]; `repetition_penalty` (vLLM's)
    > 0. Completions: `suffix` is refused (no fill-in-the-middle), `best_of` must equal `n` (no
    ranking of samples), `echo` with `logprobs` is refused (prompt logprobs are not computed)."""
    if not 1 <= req.n <= config.max_n:
        raise proxy_error(
            f"n={req.n} must be in [1, {config.max_n}]", 400, "invalid_value", param="n"
        )
    if max_tokens is not None and max_tokens < 1:
        raise proxy_error(
            f"max_tokens={max_tokens} must be >= 1", 400, "invalid_value", param="max_tokens"
        )
    temperature = 1.0 if req.temperature is None else req.temperature
    if not (math.isfinite(temperature) and 0 <= temperature <= 2):
        raise proxy_error(
            f"temperature={temperature} must be in [0, 2]",
            400,
            "invalid_value",
            param="temperature",
        )
    top_p = 1.0 if req.top_p is None else req.top_p
    if not 0 < top_p <= 1:
        raise proxy_error(f"top_p={top_p} must be in (0, 1]", 400, "invalid_value", param="top_p")
    top = _top_logprobs(req)
    stats = engine.statistics()
    bias = _logit_bias(req.logit_bias, stats.vocab_size)
    penalties = {}
    for name in ("presence_penalty", "frequency_penalty"):
        v = getattr(req, name)
        if v is not None and not (math.isfinite(v) and -2 <= v <= 2):
            raise proxy_error(f"{name}={v} must be in [-2, 2]", 400, "invalid_value", param=name)
        penalties[name] = v or 0.0
    rep = 1.0 if req.repetition_penalty is None else req.repetition_penalty
    if not (math.isfinite(rep) and rep > 0):
        raise proxy_error(
            f"repetition_penalty={rep} must be > 0",
            400,
            "invalid_value",
            param="repetition_penalty",
        )
    if isinstance(req, CompletionRequest):
        _check_completion_extras(req)
    max_model_len = stats.max_model_len
    room = max_model_len - prompt_len
    wanted = room if max_tokens is None else max_tokens
    if room < 1 or (wanted > room and config.context_overflow == "refuse"):
        ex.truncated = True
        ex.context_refusals += 1
        raise proxy_error(
            f"this model's maximum context length is {max_model_len} tokens; the prompt has "
            f"{prompt_len} tokens and {wanted} completion tokens were requested",
            400,
            "context_length_exceeded",
            param="messages",
        )
    return SamplingParams(
        max_tokens=min(wanted, room),
        temperature=temperature,
        top_p=top_p,
        top_k=req.top_k or 0,
        seed=req.seed,
        stop_token_ids=stop_token_ids
        + tuple(t for t in req.stop_token_ids or () if t not in stop_token_ids),
        n=req.n,
        top_logprobs=top,
        logit_bias=bias,
        repetition_penalty=rep,
        structured=structured,
        **penalties,
    )


def _top_logprobs(req: ChatCompletionRequest | CompletionRequest) -> int:
    """k of the top-k logprobs asked for: chat `top_logprobs` (with `logprobs: true`), completions
    `logprobs`; 400 outside [0, 20]."""
    if isinstance(req, CompletionRequest):
        k, param = req.logprobs or 0, "logprobs"
    else:
        k, param = req.top_logprobs or 0, "top_logprobs"
        if k and not req.logprobs:
            raise proxy_error(
                "top_logprobs needs logprobs: true", 400, "invalid_value", param="top_logprobs"
            )
    if not 0 <= k <= 20:
        raise proxy_error(f"{param}={k} must be in [0, 20]", 400, "invalid_value", param=param)
    return k


def _logit_bias(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float] | None:
    """`logit_bias` keyed by token ID; 400 for a key that is not a token ID of the vocabulary or
    a value outside [-100, 100]."""
    if not bias:
        return None
    out: dict[int, float] = {}
    for key, value in bias.items():
        try:
            tok = int(key)
        except ValueError:
            tok = -1
        if not 0 <= tok < vocab_size:
            raise proxy_error(
                f"logit_bias key {key!r} is not a token ID in [0, {vocab_size})",
                400,
                "invalid_value",
                param="logit_bias",
            )
        if not (math.isfinite(value) and -100 <= value <= 100):
            raise proxy_error(
                f"logit_bias[{key}]={value} must be in [-100, 100]",
                400,
                "invalid_value",
                param="logit_bias",
            )
        out[tok] = float(value)
    return out


def _check_completion_extras(req: CompletionRequest) -> None:
    """400 for the completions parameters gyre cannot honour."""
    if req.suffix:
        raise proxy_error(
            "suffix is not supported (no fill-in-the-middle template)",
            400,
            "invalid_value",
            param="suffix",
        )
    if req.best_of is not None and req.best_of != req.n:
        raise proxy_error(
            f"best_of={req.best_of} is not supported unless equal to n={req.n} (samples are "
            "not ranked; ask for n choices instead)",
            400,
            "invalid_value",
            param="best_of",
        )
    if req.echo and req.logprobs is not None:
        raise proxy_error(
            "echo with logprobs is not supported (prompt logprobs are not computed)",
            400,
            "invalid_value",
            param="echo",
        )


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    """The request's stop strings: at most 16, none empty."""
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if len(stops) > 16 or any(not s for s in stops):
        raise proxy_error(
            "stop must be at most 16 non-empty strings", 400, "invalid_value", param="stop"
        )
    return stops


def reply_message(call: Call, ch: Choice) -> tuple[dict[str, Any], ChatMessage]:
    """(JSON message for the client, the ChatMessage the renderer compares echoes with)."""
    tool_id = f"call_{call.execution.execution_id}_{call.choice_call_id(ch.index)}".replace(
        "/", "_"
    )
    parser = call.reply_parser or _GYRE_PARSER
    parsed = parser.parse(ch.text, tool_id, tools=call.rendered.tools if call.parse_tools else None)
    calls = list(parsed.tool_calls) or None
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
) -> AsyncIterator[bytes]:
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
) -> AsyncIterator[bytes]:
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
