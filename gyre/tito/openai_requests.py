"""OpenAI-format requests in: decode, check and translate one request of an execution.

Owns `proxy_error` (the `ProxyError` of a refused request), `decode_request` (a body to its
msgspec request type, every decode error a 400 naming the field, a lone surrogate escape's too:
`malformed_body`), the checks of a request's model name and chat history (`check_model`,
`check_messages`: roles, each message's text, tool-call pairing), the one prompt of a
completions request (`completion_prompt`), and its `SamplingParams` with the context limit and
every sampling parameter checked, passed on or refused (`sampling_params`, `stop_strings`).
Responses and streams are `openai_format`'s. Knows nothing about routes, keys or engines' work.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import msgspec

from gyre.config import ProxyConfig
from gyre.engines.protocol import InferenceEngine, SamplingParams, StructuredOutput
from gyre.errors import ProxyError
from gyre.tito.json_text import lone_surrogate_path
from gyre.tito.request_fields import refuse_unsupported, unknown_field
from gyre.tito.sessions import Execution
from gyre.tito.wire import (
    CHAT_DECODER,
    COMPLETION_DECODER,
    PART_PAYLOADS,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
)

__all__ = [
    "proxy_error",
    "decode_request",
    "malformed_body",
    "param_of",
    "decode_chat",
    "decode_completion",
    "template_kwargs",
    "RESERVED_TEMPLATE_KWARGS",
    "check_model",
    "check_messages",
    "completion_prompt",
    "sampling_params",
    "stop_strings",
]


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


_MISSING = re.compile(r"^Object missing required field `([^`]+)`")


def param_of(message: str) -> str | None:
    """The field msgspec's validation error names: its JSON path (`... - at
    `$.messages[0].role``), and a missing field's own name after it (`messages[0].content`)."""
    _, sep, path = message.rpartition(" - at `")
    path = path.rstrip("`").removeprefix("$").removeprefix(".") if sep else ""
    if m := _MISSING.match(message):
        path = f"{path}.{m[1]}" if path else m[1]
    return path or None


def decode_request(decoder: msgspec.json.Decoder, body: bytes) -> Any:
    """The request `body` decoded and validated by `decoder` (400 naming the offending field, or
    a field the request type does not declare: `request_fields.unknown_field`; 400 for JSON
    nested deeper than the decoder can recurse)."""
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        unknown = unknown_field(str(exc))
        if unknown is not None:
            raise unknown from None
        raise proxy_error(
            f"invalid request: {exc}", 400, "invalid_type", param=param_of(str(exc))
        ) from None
    except msgspec.DecodeError as exc:
        raise malformed_body(body, exc) from None
    except RecursionError:  # msgspec's decoder recurses per level (about 1000 deep)
        raise proxy_error("malformed JSON body: nested too deeply", 400, "invalid_json") from None


def malformed_body(body: bytes, exc: msgspec.DecodeError) -> ProxyError:
    """The 400 for a body msgspec cannot decode. A string holding a lone surrogate escape
    (`"\\ud800"`, half of a character: what a client that cut a text in the middle of an emoji
    sends; msgspec calls it truncated input) is named by its JSON path, which Python's decoder
    finds, since it accepts such escapes (on this error path only). It is refused, not replaced:
    that would change the client's data. Anything else is malformed JSON."""
    try:
        path = lone_surrogate_path(json.loads(body))
    except (ValueError, RecursionError):  # not JSON for Python either (or not UTF-8)
        path = None
    if path is None:
        return proxy_error(f"malformed JSON body: {exc}", 400, "invalid_json")
    return proxy_error(
        f"{path or 'the body'} holds a lone UTF-16 surrogate escape (one of \\ud800-\\udfff "
        "without its other half), which is no Unicode character: send the whole character",
        400,
        "invalid_value",
        param=path or None,
    )


def decode_chat(body: bytes) -> ChatCompletionRequest:
    """A Chat Completions body decoded and its fields checked (`request_fields`)."""
    req: ChatCompletionRequest = decode_request(CHAT_DECODER, body)
    refuse_unsupported(req)
    return req


def decode_completion(body: bytes) -> CompletionRequest:
    """A Completions body decoded and its fields checked (`request_fields`)."""
    req: CompletionRequest = decode_request(COMPLETION_DECODER, body)
    refuse_unsupported(req)
    return req


RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "conversations",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)
"""Keys `chat_template_kwargs` may not set: the arguments of transformers'
`apply_chat_template` (and of the render it calls) and the template's `messages`, which the
renderer passes itself; a client's would collide with them or override its own checks."""


def template_kwargs(
    kwargs: dict[str, Any] | None, reasoning_effort: str | None, verbosity: str | None
) -> dict[str, Any] | None:
    """The chat template's kwargs: the client's own (`chat_template_kwargs`; 400 naming
    `chat_template_kwargs.<key>` for a `RESERVED_TEMPLATE_KWARGS` key), then a reasoning
    effort as `reasoning_effort` and `enable_thinking` (false for `none`) and a verbosity as
    `verbosity`, where the client set no such key (as vLLM passes `reasoning_effort`). Every
    chat API renders them this way (Chat's `reasoning_effort`, Responses' `reasoning.effort`,
    Messages' `output_config.effort`). A template that reads none of them renders the same
    prompt, as with vLLM."""
    for key in kwargs or ():
        if key in RESERVED_TEMPLATE_KWARGS:
            raise proxy_error(
                f"chat_template_kwargs.{key} is an argument the proxy gives the chat template "
                "itself, not a template variable (set the request's own field, where it has one)",
                400,
                "invalid_value",
                param=f"chat_template_kwargs.{key}",
            )
    out = dict(kwargs or {})
    if reasoning_effort is not None:
        out.setdefault("reasoning_effort", reasoning_effort)
        out.setdefault("enable_thinking", reasoning_effort != "none")
    if verbosity is not None:
        out.setdefault("verbosity", verbosity)
    return out or None


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
    """400 for a history that would go into training data malformed, naming the field: an empty
    conversation, an unknown role, a message without its text (`_check_content`), a `tool`
    message without `tool_call_id` or whose `tool_call_id` names no tool call of an earlier
    assistant message (an orphan)."""
    if not messages:
        raise proxy_error("messages must not be empty", 400, "invalid_value", param="messages")
    called: set[str] = set()
    for i, m in enumerate(messages):
        if m.role not in _ROLES:
            raise proxy_error(
                f"messages[{i}].role={m.role!r} must be one of {', '.join(sorted(_ROLES))}",
                400,
                "invalid_value",
                param=f"messages[{i}].role",
            )
        _check_content(m, f"messages[{i}].content")
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


def _check_content(m: ChatMessage, at: str) -> None:
    """400 naming `at` (the message's `content`) or one of its parts unless the message has its
    text: a string or text parts, each with its `text` (images, audio and files are not served).
    Only an assistant message may go without content, when it carries tool calls or reasoning
    (OpenAI's schema: content "required unless tool_calls is specified"), so no template ever
    gets a None where it expects text."""
    if m.content is None:
        if m.role != "assistant":
            raise proxy_error(
                f"{at} is required: a {m.role} message needs its text",
                400,
                "invalid_value",
                param=at,
            )
        if not m.tool_calls and m.reasoning_content is None and m.reasoning is None:
            raise proxy_error(
                f"{at} is required: an assistant message needs content or tool_calls",
                400,
                "invalid_value",
                param=at,
            )
        return
    if isinstance(m.content, str):
        return
    for j, part in enumerate(m.content):
        where = f"{at}[{j}]"
        if part.type != "text":
            raise proxy_error(
                f"{where}: content part of type {part.type!r} is not supported (text only)",
                400,
                "invalid_value",
                param=f"{where}.type",
            )
        if part.text is None:
            raise proxy_error(
                f"{where}.text is required", 400, "invalid_value", param=f"{where}.text"
            )
        extra = next((f for f in PART_PAYLOADS if getattr(part, f) is not None), None)
        if extra is not None:
            raise proxy_error(
                f"{where}.{extra} is not a field of a text part",
                400,
                "unsupported_parameter",
                param=f"{where}.{extra}",
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
    never dropped (docs/request_fields.md). `min_p` is truncation, like `top_p` and `top_k`:
    passed on and recorded, and such executions are not trained (invariant 2); `min_tokens`,
    `allowed_token_ids` and `bad_words` mask tokens, like `logit_bias`; `ignore_eos` leaves the
    model's end IDs out of the stop IDs (the request's own, token IDs of the vocabulary, still
    stop). `logit_bias` and the
    presence, frequency and repetition penalties are passed to the engine and recorded with the
    call (`ModelCall.sampling`); the behaviour logprobs are those of the distribution they
    produce (vLLM's processed logprobs, invariant 2), so the trainer's importance ratio
    pi_theta / pi_behaviour accounts for them like any off-policy sample. Ranges are
    OpenAI's (API reference, Chat and Completions): biases in [-100, 100] on token IDs of the
    vocabulary, presence and frequency penalties in [-2, 2], `top_logprobs` (chat, needs
    `logprobs: true`) and completions' `logprobs` in [0, 20]; `repetition_penalty` (vLLM's)
    > 0; `seed` a signed 64-bit integer and `top_k` in [0, 2**63) (vLLM's ranges; larger ones
    cannot be recorded). Completions: `suffix` is refused (no fill-in-the-middle), `best_of` must
    equal `n` (no ranking of samples), `echo` with `logprobs` is refused (prompt logprobs are not
    computed)."""
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
    if req.seed is not None and not _INT64_MIN <= req.seed <= _INT64_MAX:
        raise proxy_error(
            f"seed={req.seed} must be a 64-bit signed integer", 400, "invalid_value", param="seed"
        )
    top_k = req.top_k or 0
    min_p = req.min_p or 0.0
    if not (math.isfinite(min_p) and 0 <= min_p <= 1):
        raise proxy_error(f"min_p={min_p} must be in [0, 1]", 400, "invalid_value", param="min_p")
    if not 0 <= top_k <= _INT64_MAX:
        raise proxy_error(
            f"top_k={top_k} must be 0 (off) or a positive 64-bit integer",
            400,
            "invalid_value",
            param="top_k",
        )
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
    allowed, bad_words = _masks(req, stats.vocab_size)
    stop_ids = req.stop_token_ids or ()
    bad = next((t for t in stop_ids if not 0 <= t < stats.vocab_size), None)
    if bad is not None:
        raise proxy_error(
            f"stop_token_ids must be token IDs in [0, {stats.vocab_size}) ({bad} is not)",
            400,
            "invalid_value",
            param="stop_token_ids",
        )
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
    if req.min_tokens > min(wanted, room):
        raise proxy_error(
            f"min_tokens={req.min_tokens} must be in [0, max_tokens={min(wanted, room)}]",
            400,
            "invalid_value",
            param="min_tokens",
        )
    ends = () if req.ignore_eos else stop_token_ids
    return SamplingParams(
        max_tokens=min(wanted, room),
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        seed=req.seed,
        stop_token_ids=ends + tuple(t for t in stop_ids if t not in ends),
        n=req.n,
        top_logprobs=top,
        logit_bias=bias,
        repetition_penalty=rep,
        structured=structured,
        min_tokens=req.min_tokens,
        allowed_token_ids=allowed,
        bad_words=bad_words,
        **penalties,
    )


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
"""vLLM's range for `seed` (its OpenAI protocol), also what the call log can store."""


def _masks(
    req: ChatCompletionRequest | CompletionRequest, vocab_size: int
) -> tuple[tuple[int, ...] | None, tuple[str, ...]]:
    """(`allowed_token_ids`: token IDs of the vocabulary, at least one; `bad_words`: non-blank
    texts) as `SamplingParams` takes them; 400 naming the field otherwise."""
    allowed = req.allowed_token_ids
    if allowed is not None:
        bad = next((t for t in allowed if not 0 <= t < vocab_size), None)
        if not allowed or bad is not None:
            raise proxy_error(
                f"allowed_token_ids must be token IDs in [0, {vocab_size}), at least one"
                + ("" if bad is None else f" ({bad} is not)"),
                400,
                "invalid_value",
                param="allowed_token_ids",
            )
    if not all(w.strip() for w in req.bad_words or ()):
        raise proxy_error(
            "bad_words must be non-blank texts", 400, "invalid_value", param="bad_words"
        )
    return (None if allowed is None else tuple(allowed)), tuple(req.bad_words or ())


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
