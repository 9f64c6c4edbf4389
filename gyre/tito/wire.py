"""OpenAI-compatible wire types of the TITO proxy: request bodies, chat messages, error bodies.

Owns the msgspec Structs that request bodies are decoded into (`ChatCompletionRequest`,
`CompletionRequest`, `ChatMessage`, `ToolCall`, ...), one decoder per request type built once, and
`error_body`. Every field of OpenAI's schemas and of vLLM's extras is declared: honoured, accepted
without effect (it changes neither what is sampled nor what is returned), or refused unless it
asks for nothing (`request_fields`); a top-level field no schema lists is refused with a 400
naming it, and wrong types with the offending JSON path (docs/request_fields.md has the table).
Messages and content parts refuse unknown keys too, accepting the response-only fields echoed
replies carry. Knows nothing about tokens, engines or executions.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = [
    "FunctionCall",
    "ToolCall",
    "ContentPart",
    "PART_PAYLOADS",
    "ChatMessage",
    "StreamOptions",
    "ResponseFormat",
    "StructuredOutputs",
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


class ContentPart(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True
):
    """One part of a multi-part `content`: only `text` parts are served (`check_messages`
    refuses a part without `text` and any other type, naming it); a key no part type of OpenAI's
    schema has is refused."""

    type: str
    text: str | None = None
    prompt_cache_breakpoint: Any = None
    """No effect: a prompt-cache hint (every known prefix is reused anyway)."""
    image_url: Any = None
    """The payloads of other part types (`image_url`, `input_audio`, `file`, `refusal`):
    decoded only so that the part is refused by its type."""
    input_audio: Any = None
    file: Any = None
    refusal: Any = None


PART_PAYLOADS = ("image_url", "input_audio", "file", "refusal")
"""`ContentPart` fields of the part types that are refused (none belongs in a text part)."""


class ChatMessage(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True
):
    """One chat message as the agent sent it. A key no message schema lists is refused; the
    response-only fields an echoed reply carries (`refusal`, `annotations`, `audio`, the openai
    SDK's `parsed`, gyre's own `gyre_tool_call_error`) are accepted without effect (no template
    reads them); a legacy `function_call` is refused."""

    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    """Alias of `reasoning_content` used by newer vLLM and some clients."""
    function_call: Any = None
    """The deprecated legacy call: refused unless null (`tool_calls` carry calls)."""
    refusal: Any = None
    """No effect, as `annotations`, `audio`, `parsed` and `gyre_tool_call_error`: fields of a
    reply that clients echo back."""
    annotations: Any = None
    audio: Any = None
    parsed: Any = None
    gyre_tool_call_error: Any = None


class StreamOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    include_usage: bool = False
    include_obfuscation: bool | None = None
    """No effect: the proxy never pads stream deltas with an `obfuscation` field."""
    continuous_usage_stats: Any = None
    """vLLM's usage in every chunk: refused unless false (`request_fields`)."""


class ResponseFormat(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`response_format`: `text`, `json_object`, or `json_schema` with
    `json_schema: {"name", "schema", "strict"}` (OpenAI API reference, Chat, "response_format")."""

    type: str
    json_schema: dict[str, Any] | None = None


class StructuredOutputs(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """vLLM's `structured_outputs`: exactly one of `json` (a schema), `regex`, `choice`,
    `grammar` (EBNF), `json_object`, `structural_tag` (`constraints.request_constraint`)."""

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    """No effect: JSON is always compiled without free whitespace (`engines.vllm_params`)."""
    disable_additional_properties: Any = None
    """Refused unless false: the schema is enforced as sent."""
    whitespace_pattern: Any = None
    """Refused unless null."""


class _Request(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The fields Chat Completions and Completions share (OpenAI's schemas and vLLM's extras).

    Every field a schema lists is declared: honoured, accepted without effect (it changes
    neither what is sampled nor what is returned) or refused unless it asks for nothing
    (`request_fields.REFUSED`); a field no schema lists is refused. docs/request_fields.md
    holds the table."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    """vLLM's: truncation like `top_p` (recorded; such executions are not trained)."""
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    logit_bias: dict[str, float] | None = None
    """Token ID (as a JSON key) -> bias added to its logit, in [-100, 100]."""
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    """vLLM's extra sampling parameter."""
    min_tokens: int = 0
    ignore_eos: bool = False
    """The model's end tokens do not stop the choice (only the request's own stop IDs do)."""
    bad_words: list[str] | None = None
    allowed_token_ids: list[int] | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: str | dict[str, Any] | None = None
    """vLLM's legacy spelling of `structured_outputs.json` (also `guided_regex`,
    `guided_choice`, `guided_grammar`): honoured as that."""
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
    """No effect: xgrammar compiles every grammar."""
    return_token_ids: bool = False
    """vLLM's flag: also return `prompt_token_ids` (the whole prompt: O(history) bytes per call,
    so opt-in). Per-choice `token_ids` are always returned."""
    # Without effect on what is sampled or returned: identifiers, cache and scheduling hints.
    user: str | None = None
    priority: int = 0
    cache_salt: str | None = None
    session_id: str | None = None
    length_penalty: float = 1.0
    """Beam search only (refused)."""
    spaces_between_special_tokens: bool = True
    """Fast-tokenizer decoding puts no spaces between tokens either way."""
    stream_interval: int | None = None
    """Tokens per streamed chunk: the chunks' joined text and tokens are the same."""
    truncation_side: str | None = None
    """Only read with `truncate_prompt_tokens` (refused)."""
    # Refused unless they ask for nothing (`request_fields.REFUSED` says why).
    include_stop_str_in_output: Any = None
    skip_special_tokens: Any = None
    return_tokens_as_token_ids: Any = None
    return_token_offsets: Any = None
    logprob_token_ids: Any = None
    prompt_logprobs: Any = None
    truncate_prompt_tokens: Any = None
    use_beam_search: Any = None
    thinking_token_budget: Any = None
    repetition_detection: Any = None
    watermarking: Any = None
    vllm_xargs: Any = None
    kv_transfer_params: Any = None
    ec_transfer_params: Any = None
    mm_payload: Any = None
    return_mm_kwargs: Any = None
    routed_experts_prompt_start: Any = None
    request_id: Any = None
    guided_whitespace_pattern: Any = None


class ChatCompletionRequest(_Request, frozen=True, kw_only=True):
    """`POST /v1/chat/completions` body (every field is honoured, without effect or refused)."""

    messages: list[ChatMessage]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    """The last message is left open and the reply continues it (needs
    `add_generation_prompt: false`)."""
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    """Rendered as the `reasoning_effort` and `enable_thinking` template kwargs (as the
    Responses API's `reasoning.effort`)."""
    verbosity: Literal["low", "medium", "high"] | None = None
    """Rendered as the `verbosity` template kwarg (as the Responses API's `text.verbosity`)."""
    # Without effect (see `_Request`).
    metadata: dict[str, str] | None = None
    store: bool | None = None
    """OpenAI's stored completions; the proxy records every call anyway."""
    service_tier: str | None = None
    modalities: list[str] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = None
    include_reasoning: bool = True
    # Refused unless they ask for nothing.
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    prediction: Any = None
    web_search_options: Any = None
    moderation: Any = None
    echo: Any = None
    add_special_tokens: Any = None
    chat_template: Any = None
    documents: Any = None
    media_io_kwargs: Any = None
    mm_processor_kwargs: Any = None
    return_prompt_text: Any = None


class CompletionRequest(_Request, frozen=True, kw_only=True):
    """`POST /v1/completions` body: `prompt` is text or token IDs (one prompt per request)."""

    prompt: str | list[Any]
    """Text, token IDs, or a one-element list of either (see `openai_format.completion_prompt`)."""
    max_tokens: int | None = 16
    logprobs: int | None = None
    best_of: int | None = None
    """Refused unless equal to `n` (no server-side ranking)."""
    suffix: str | None = None
    """Refused (no fill-in-the-middle template)."""
    echo: bool = False
    add_special_tokens: bool = True
    """vLLM's: the tokenizer's special tokens (a BOS) are added to a text prompt."""
    prompt_embeds: Any = None
    """Refused (token IDs or text only)."""


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
