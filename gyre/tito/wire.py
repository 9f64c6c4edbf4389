"""OpenAI-compatible wire types of the TITO proxy: request bodies, chat messages, error bodies.

Owns the msgspec Structs that request bodies are decoded into (`ChatCompletionRequest`,
`CompletionRequest`, `ChatMessage`, `ToolCall`, ...), one decoder per request type built once, and
`error_body`. Unknown fields are ignored (clients send many extras); wrong types are refused by the
decoder with the offending JSON path. Every field that changes what is sampled or returned is
declared here, so it is honoured or refused, never dropped. Knows nothing about tokens, engines or
executions.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "FunctionCall",
    "ToolCall",
    "ContentPart",
    "ChatMessage",
    "StreamOptions",
    "ResponseFormat",
    "ChatCompletionRequest",
    "CompletionRequest",
    "CHAT_DECODER",
    "COMPLETION_DECODER",
    "JSON_ENCODER",
    "error_body",
    "message_text",
]


class FunctionCall(msgspec.Struct, frozen=True, kw_only=True):
    """`tool_calls[i].function`: the tool name and its JSON arguments (a string, or an object
    from clients that send one; the template renders a string verbatim)."""

    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One tool call of an assistant message."""

    function: FunctionCall
    id: str | None = None
    type: str = "function"


class ContentPart(msgspec.Struct, frozen=True, kw_only=True):
    """One part of a multi-part `content` (only `text` parts are supported)."""

    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One chat message as the agent sent it (extra fields such as `refusal` are dropped)."""

    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    """Alias of `reasoning_content` used by newer vLLM and some clients."""


class StreamOptions(msgspec.Struct, frozen=True, kw_only=True):
    include_usage: bool = False


class ResponseFormat(msgspec.Struct, frozen=True, kw_only=True):
    """`response_format`: `text`, `json_object`, or `json_schema` with
    `json_schema: {"name", "schema", "strict"}` (OpenAI API reference, Chat, "response_format")."""

    type: str
    json_schema: dict[str, Any] | None = None


class ChatCompletionRequest(msgspec.Struct, frozen=True, kw_only=True):
    """`POST /v1/chat/completions` body (the fields gyre honours; others are ignored)."""

    model: str
    messages: list[ChatMessage]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    logit_bias: dict[str, float] | None = None
    """Token ID (as a JSON key) -> bias added to its logit, in [-100, 100]."""
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    """vLLM's extra sampling parameter."""
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_ids: bool = False
    """vLLM's flag: also return `prompt_token_ids` (the whole prompt: O(history) bytes per call,
    so opt-in). Per-choice `token_ids` are always returned."""


class CompletionRequest(msgspec.Struct, frozen=True, kw_only=True):
    """`POST /v1/completions` body: `prompt` is text or token IDs (one prompt per request)."""

    model: str
    prompt: str | list[Any]
    """Text, token IDs, or a one-element list of either (see `openai_format.completion_prompt`)."""
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    max_tokens: int | None = 16
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    logprobs: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    logit_bias: dict[str, float] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    best_of: int | None = None
    """Refused unless equal to `n` (no server-side ranking)."""
    suffix: str | None = None
    """Refused (no fill-in-the-middle template)."""
    echo: bool = False
    return_token_ids: bool = False
    """Also return `prompt_token_ids`; per-choice `token_ids` are always returned."""


CHAT_DECODER = msgspec.json.Decoder(ChatCompletionRequest)
COMPLETION_DECODER = msgspec.json.Decoder(CompletionRequest)
JSON_ENCODER = msgspec.json.Encoder()


def message_text(content: str | list[ContentPart] | None) -> str | None:
    """The text of a `content` field: a string as is, text parts concatenated, None as None.

    Raises ValueError for a non-text part (images and audio are not supported)."""
    if content is None or isinstance(content, str):
        return content
    out = []
    for part in content:
        if part.type != "text" or part.text is None:
            raise ValueError(f"content part of type {part.type!r} is not supported (text only)")
        out.append(part.text)
    return "".join(out)


def error_body(
    message: str, *, type: str, code: str | None = None, param: str | None = None
) -> bytes:
    """An OpenAI-style error body: `{"error": {"message", "type", "param", "code"}}` as JSON
    bytes."""
    return JSON_ENCODER.encode(
        {"error": {"message": message, "type": type, "param": param, "code": code}}
    )
