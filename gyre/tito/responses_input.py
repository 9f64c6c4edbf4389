"""Responses API requests: the body (`ResponsesRequest`) and the chat request it means.

Owns the request Struct (a field it does not list is refused, never ignored), `input_messages`
(input items to chat messages: a response echoed back re-renders to the tokens sampled),
`chat_tools`, `chat_tool_choice` and `chat_request` (the whole `ChatCompletionRequest`).
Protocol: OpenAI's API reference for Responses, as typed by the official SDK
(`openai.types.responses`) and vLLM (`vllm/entrypoints/openai/responses/protocol.py`). Knows
nothing about response chains, calls, HTTP or engines.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from gyre.tito.constraints import check_json_schema
from gyre.tito.openai_requests import decode_request, proxy_error, template_kwargs
from gyre.tito.wire import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    StreamOptions,
    ToolCall,
)

__all__ = [
    "ResponsesRequest",
    "ResponsesCall",
    "RESPONSES_DECODER",
    "decode_responses",
    "input_messages",
    "chat_tools",
    "chat_tool_choice",
    "chat_request",
    "bad_request",
]

_CHAT_FIELDS = frozenset(ChatCompletionRequest.__struct_fields__)
_INCLUDES = frozenset({"message.output_text.logprobs", "reasoning.encrypted_content"})
_SUMMARIES = ("auto", "detailed")
"""`reasoning.summary` values served: the summary is the reasoning text itself (the most detailed
one there is); `concise` cannot be honoured."""
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
"""Input message roles to chat roles: `developer` is the system role of chat templates."""
_NOTHING: dict[str, tuple[tuple[Any, ...], str]] = {
    "phase": ((None,), "message phases label OpenAI's own models' turns, not this model's"),
    "namespace": ((None,), "tool namespaces are not served"),
    "caller": ((None, {"type": "direct"}), "only the model itself calls tools here"),
    "async": ((None, False), "asynchronous tool calls are not served"),
}
"""Item keys accepted only when they ask for nothing: (those values, why any other is refused)."""
_ITEM_KEYS = {
    "message": frozenset({"type", "role", "content", "id", "status", "phase"}),
    "reasoning": frozenset({"type", "id", "summary", "content", "encrypted_content", "status"}),
    "function_call": frozenset(
        {"type", "id", "call_id", "name", "arguments", "status", "caller", "namespace", "async"}
    ),
    "function_call_output": frozenset(
        {"type", "id", "call_id", "output", "status", "name", "caller", "namespace"}
    ),
}
"""The keys of each input item type served (the SDK's `ResponseInputItemParam` types): what is
read, identifiers and `status` (no effect), `_NOTHING`'s; any other key is refused."""
_PART_KEYS = {
    "input_text": frozenset({"type", "text", "prompt_cache_breakpoint"}),
    "output_text": frozenset({"type", "text", "annotations", "logprobs"}),
    "reasoning_text": frozenset({"type", "text"}),
}
"""The keys of each content part type served: `text`, and a cache hint, an echoed output's
annotations and logprobs (no effect); any other key is refused."""


def _check_keys(obj: dict[str, Any], allowed: frozenset[str], param: str) -> None:
    """400 naming `param.key` for a key of `obj` not `allowed`, or set to what `_NOTHING`
    refuses: a key no schema lists is refused, never ignored."""
    for key, value in obj.items():
        if key not in allowed:
            raise bad_request(
                f"{param}.{key} is not supported by this server (gyre refuses a field it does "
                "not know rather than ignore it)",
                f"{param}.{key}",
                "unsupported_parameter",
            )
        if key in _NOTHING and value not in _NOTHING[key][0]:
            raise bad_request(
                f"{param}.{key} is not supported by this server: {_NOTHING[key][1]}",
                f"{param}.{key}",
                "unsupported_parameter",
            )


class TextConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`text`: the output format (`text`, `json_object`, `json_schema`) and verbosity."""

    format: dict[str, Any] | None = None
    verbosity: str | None = None


class ReasoningConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`reasoning`: the effort asked for (`none` ... `xhigh`) and the summary (`_SUMMARIES`)."""

    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None
    """The older name of `summary`."""

    @property
    def summarized(self) -> bool:
        """Whether reasoning items carry a summary (the reasoning text: `_SUMMARIES`)."""
        return (self.summary or self.generate_summary) is not None


class StreamObfuscation(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`stream_options`: no effect (the proxy never pads stream events with `obfuscation`)."""

    include_obfuscation: bool | None = None


class ResponsesRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/responses` body. A field not listed is refused (400), never ignored."""

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    stream: bool = False
    text: TextConfig | None = None
    previous_response_id: str | None = None
    store: bool = True
    """False: the response is not kept, so no later request can chain onto it."""
    metadata: dict[str, str] | None = None
    reasoning: ReasoningConfig | None = None
    include: list[str] | None = None
    truncation: str | None = None
    background: bool | None = None
    service_tier: str | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    max_tool_calls: int | None = None
    """Bounds calls of built-in tools, and none is served."""
    stream_options: StreamObfuscation | None = None
    """Identifiers, cache hints, a bound on built-in tool calls and stream padding: they change
    nothing that is sampled or returned (prefix caching is automatic), so they are accepted."""
    # Sampling fields of vLLM's Responses route (as on Chat Completions; checked there).
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    logit_bias: dict[str, float] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_ids: bool = False


RESPONSES_DECODER = msgspec.json.Decoder(ResponsesRequest)
_UNKNOWN_FIELD = re.compile(r"unknown field `([^`]+)`")


def decode_responses(body: bytes) -> ResponsesRequest:
    """The request body decoded; 400 naming the field for a wrong type or a field this server
    does not support (code `unsupported_parameter`)."""
    try:
        return RESPONSES_DECODER.decode(body)
    except msgspec.ValidationError as exc:
        m = _UNKNOWN_FIELD.search(str(exc))
        if m is not None and "at `" not in str(exc):
            raise bad_request(
                f"{m.group(1)} is not supported by this server",
                m.group(1),
                "unsupported_parameter",
            ) from None
    except (msgspec.DecodeError, RecursionError):
        pass  # not JSON at all, or nested too deeply: the decoder's 400 below
    return decode_request(RESPONSES_DECODER, body)  # raises the decoder's 400


@dataclass(frozen=True, slots=True)
class ResponsesCall:
    """A decoded Responses request: what `answer` and `stream` need beside the call."""

    request: ResponsesRequest
    chat: ChatCompletionRequest
    link: Any
    """The stored response this one continues (`responses_api._Link`), or None."""
    new: tuple[ChatMessage, ...]
    """The messages of this request's `input` (the instructions excluded: a chained response
    does not inherit them)."""


def bad_request(message: str, param: str | None, code: str = "invalid_value") -> Exception:
    """A 400 `invalid_request_error` naming the offending `param`."""
    return proxy_error(message, 400, code, param=param, type="invalid_request_error")


def _text_of(content: Any, param: str, kinds: tuple[str, ...]) -> str:
    """The text of an item's `content`/`output`: a string, or text parts of the `kinds` given."""
    if isinstance(content, str):
        return content
    if content is None:
        raise bad_request(f"{param} is required", param)
    if not isinstance(content, list):
        raise bad_request(f"{param} must be a string or a list of content parts", param)
    out = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds:
            raise bad_request(
                f"content part of type {kind!r} is not supported here (text only: "
                f"{', '.join(kinds)})",
                f"{param}[{i}]",
            )
        if not isinstance(part.get("text"), str):
            raise bad_request(f"{param}[{i}].text must be a string", f"{param}[{i}].text")
        _check_keys(part, _PART_KEYS[kind], f"{param}[{i}]")
        out.append(part["text"])
    return "".join(out)


def input_messages(
    items: str | list[dict[str, Any]],
    unseal: Callable[[str, str], str] | None = None,
    history: Sequence[ChatMessage] = (),
) -> list[ChatMessage]:
    """The chat messages that Responses `input` items mean.

    A string is one user message. `message` items become messages (`developer` as `system`);
    a `reasoning` item, an assistant `message` and `function_call` items that follow each other
    form one assistant message (reasoning, content, tool calls: the order the proxy answers
    them in), so an echoed response re-renders to the tokens that were sampled;
    `function_call_output` becomes a `tool` message. A reasoning item's text is its
    `reasoning_text` content, or else what its `encrypted_content` holds: `unseal(sealed,
    param)` gives that text or raises the 400 naming `param` (always checked; without `unseal`
    every `encrypted_content` is refused). Raises ProxyError(400) for an item type, role or
    content part that is not supported, or a `function_call_output` whose `call_id` answers no
    call of `history` (the chained conversation) or of an earlier item, naming it.
    """
    if isinstance(items, str):
        return [ChatMessage(role="user", content=items)]
    out: list[ChatMessage] = []
    turn: dict[str, Any] = {}
    called = {tc.id for m in history for tc in m.tool_calls or () if tc.id is not None}

    def flush() -> None:
        if turn:
            calls = turn.get("tool_calls")
            out.append(
                ChatMessage(
                    role="assistant",
                    content=turn.get("content", None if calls else ""),  # as `reply_message`
                    reasoning_content=turn.get("reasoning"),
                    tool_calls=calls or None,
                )
            )
            turn.clear()

    for i, item in enumerate(items):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"{param} must be an object", param, "invalid_type")
        kind = item.get("type", "message")
        if isinstance(kind, str) and kind in _ITEM_KEYS:
            _check_keys(item, _ITEM_KEYS[kind], param)
        if kind == "message":
            asked = item.get("role")
            role = _ROLES.get(asked) if isinstance(asked, str) else None  # a list is unhashable
            if role is None:
                raise bad_request(
                    f"{param}.role {item.get('role')!r} is not one of {list(_ROLES)}", param
                )
            if role == "assistant":
                text = _text_of(item.get("content"), f"{param}.content", ("output_text",))
                if "content" in turn or "tool_calls" in turn:
                    flush()
                turn["content"] = text
                continue
            text = _text_of(item.get("content"), f"{param}.content", ("input_text",))
            flush()
            out.append(ChatMessage(role=role, content=text))
        elif kind == "reasoning":
            sealed, at = item.get("encrypted_content"), f"{param}.encrypted_content"
            restored: str | None = None
            if sealed is not None:
                if unseal is None or not isinstance(sealed, str):
                    raise bad_request(f"{at} was not issued by this server", at)
                restored = unseal(sealed, at)
            parts = item.get("content") or []
            text = _text_of(parts, f"{param}.content", ("reasoning_text",))
            flush()
            turn["reasoning"] = text if parts or restored is None else restored
        elif kind == "function_call":
            name, args, call_id = item.get("name"), item.get("arguments"), item.get("call_id")
            if not (isinstance(name, str) and isinstance(args, str) and isinstance(call_id, str)):
                raise bad_request(f"{param} needs string name, arguments and call_id", param)
            turn.setdefault("tool_calls", []).append(
                ToolCall(id=call_id, function=FunctionCall(name=name, arguments=args))
            )
            called.add(call_id)
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise bad_request(f"{param}.call_id must be a string", f"{param}.call_id")
            if item["call_id"] not in called:
                raise bad_request(
                    f"{param}.call_id={item['call_id']!r} answers no function_call before it",
                    f"{param}.call_id",
                )
            text = _text_of(item.get("output"), f"{param}.output", ("input_text",))
            flush()
            out.append(ChatMessage(role="tool", content=text, tool_call_id=item["call_id"]))
        else:
            raise bad_request(f"input item type {kind!r} is not supported", param)
    flush()
    return out


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Flat Responses function tools (`{"type": "function", "name", "parameters", ...}`) as
    chat tools (`{"type": "function", "function": {...}}`); 400 for any other tool type."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise bad_request(
                f"tool type {tool.get('type')!r} is not supported (function tools only)",
                f"tools[{i}]",
            )
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise bad_request(f"tools[{i}].name must be a non-empty string", f"tools[{i}].name")
        fn = {k: v for k, v in tool.items() if k != "type"}
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """`tool_choice` in chat's shape: `none`/`auto`/`required` as is, `{"type": "function",
    "name"}` as `{"type": "function", "function": {"name"}}`; 400 for hosted-tool choices."""
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    raise bad_request(f"tool_choice {choice!r} is not supported", "tool_choice")


def _response_format(fmt: dict[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` as chat's `response_format` (None for plain text)."""
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise bad_request(
                "text.format json_schema needs schema (a JSON schema object)", "text.format"
            )
        check_json_schema(fmt["schema"], "text.format")
        schema = {k: v for k, v in fmt.items() if k != "type"}
        return {"type": "json_schema", "json_schema": schema}
    raise bad_request(f"text.format type {fmt.get('type')!r} is not supported", "text.format")


def _refuse_unsupported(req: ResponsesRequest) -> None:
    """400 for a field set to something this proxy cannot do (never accepted and ignored)."""
    refused = {
        "truncation": req.truncation not in (None, "disabled"),
        "background": bool(req.background),
        "service_tier": req.service_tier not in (None, "auto", "default"),
        "reasoning.summary": req.reasoning is not None
        and (req.reasoning.summary or req.reasoning.generate_summary or "auto") not in _SUMMARIES,
    }
    for field, bad in refused.items():
        if bad:
            raise bad_request(
                f"{field} is not supported by this server", field, "unsupported_value"
            )
    for name in req.include or ():
        if name not in _INCLUDES:
            raise bad_request(
                f"include {name!r} is not supported (supported: {sorted(_INCLUDES)})",
                "include",
                "unsupported_value",
            )
    if req.max_output_tokens is not None and req.max_output_tokens < 1:
        raise bad_request(
            f"max_output_tokens={req.max_output_tokens} must be >= 1", "max_output_tokens"
        )


def chat_request(req: ResponsesRequest, history: list[ChatMessage]) -> ChatCompletionRequest:
    """The chat request a Responses request means, `history` (the chained conversation and the
    new input) after a system message of the `instructions`.

    `reasoning.effort` and `text.verbosity` reach the chat template as `reasoning_effort` /
    `enable_thinking` and `verbosity` kwargs (as vLLM passes `reasoning_effort`);
    `max_output_tokens` is `max_completion_tokens`; `text.format` becomes `response_format` and
    `parallel_tool_calls: false` `parallel_tool_calls`, both refused (400) while the chat request
    has no such field. Raises ProxyError(400) for what cannot be honoured.
    """
    _refuse_unsupported(req)
    if not history:
        raise bad_request("input must not be empty", "input")
    head = (
        [] if req.instructions is None else [ChatMessage(role="system", content=req.instructions)]
    )
    kwargs = template_kwargs(
        req.chat_template_kwargs,
        req.reasoning.effort if req.reasoning is not None else None,
        req.text.verbosity if req.text is not None else None,
    )
    chat: dict[str, Any] = dict(
        model=req.model,
        messages=head + history,
        tools=chat_tools(req.tools),
        tool_choice=chat_tool_choice(req.tool_choice),
        stream=req.stream,
        stream_options=StreamOptions(include_usage=True) if req.stream else None,
        max_completion_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        seed=req.seed,
        stop=req.stop,
        logprobs="message.output_text.logprobs" in (req.include or ()),
        top_logprobs=req.top_logprobs,
        chat_template_kwargs=kwargs,
        return_token_ids=req.return_token_ids,
        logit_bias=req.logit_bias,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty,
    )
    extra = {
        "response_format": _response_format(req.text.format if req.text else None),
        "parallel_tool_calls": None if req.parallel_tool_calls is not False else False,
    }
    for field, value in extra.items():
        if value is None:
            continue
        if field not in _CHAT_FIELDS:
            raise bad_request(
                f"{field} cannot be enforced by this server yet", field, "unsupported_value"
            )
        chat[field] = value
    return msgspec.convert(chat, ChatCompletionRequest)
