"""Which request fields the OpenAI routes refuse, and the rule for a field no schema lists.

Every field of a request body is honoured, accepted without effect (it changes neither what is
sampled nor what is returned), or refused with a 400 naming it; docs/request_fields.md keeps the
table and tests/tito/test_request_fields.py walks it against the official schemas. Owns `REFUSED`
(per field: the values accepted because they ask for nothing, and why any other is refused),
`refuse_unsupported` (applies it to a decoded Chat Completions or Completions request) and
`unknown_field` (a field the request's Struct does not declare: 400 `unsupported_parameter`).
Knows nothing about sampling, rendering or engines.
"""

from __future__ import annotations

import re
from typing import Any

from gyre.errors import ProxyError
from gyre.tito.wire import ChatCompletionRequest, CompletionRequest

__all__ = ["REFUSED", "refuse_unsupported", "unknown_field"]

_OFF = (None, False)
_NONE = (None,)
_COMMON: dict[str, tuple[tuple[Any, ...], str]] = {
    "include_stop_str_in_output": (_OFF, "the reply text always ends before a stop string"),
    "skip_special_tokens": (
        _OFF,
        "the reply is decoded with special tokens kept, so the model format's parser sees its tags",
    ),
    "return_tokens_as_token_ids": (_OFF, "logprob tokens are returned as text"),
    "return_token_offsets": (_OFF, "token offsets are not returned"),
    "logprob_token_ids": (_NONE, "logprobs of chosen token IDs are not returned"),
    "prompt_logprobs": (_NONE, "prompt logprobs are not computed"),
    "truncate_prompt_tokens": (_NONE, "a prompt is never truncated (the context limit refuses)"),
    "use_beam_search": (_OFF, "beam search is not supported (independent samples only)"),
    "thinking_token_budget": (_NONE, "a reasoning budget is not enforced"),
    "repetition_detection": (_NONE, "repetition detection is not supported"),
    "watermarking": (_NONE, "watermarking is not supported"),
    "vllm_xargs": (_NONE, "custom logits processors are not served"),
    "kv_transfer_params": (_NONE, "KV transfer is the proxy's own (cells migrate KV themselves)"),
    "ec_transfer_params": (_NONE, "encoder-cache transfer is not supported (text only)"),
    "mm_payload": (_NONE, "multimodal input is not supported (text only)"),
    "return_mm_kwargs": (_OFF, "multimodal input is not supported (text only)"),
    "routed_experts_prompt_start": (_NONE, "routed experts are not returned"),
    "request_id": (_NONE, "response IDs are the proxy's (they name the recorded call)"),
    "guided_whitespace_pattern": (_NONE, "JSON is compiled without free whitespace"),
}
_CHAT: dict[str, tuple[tuple[Any, ...], str]] = {
    "functions": (
        _NONE,
        "the deprecated legacy functions are not supported: send them as tools",
    ),
    "function_call": (
        _NONE,
        "the deprecated legacy function_call is not supported: send tool_choice",
    ),
    "audio": (_NONE, "audio output is not supported (text only)"),
    "modalities": ((None, ["text"]), "only text output is supported"),
    "prediction": (_NONE, "predicted outputs are not supported"),
    "web_search_options": (_NONE, "web search is not served"),
    "moderation": (_NONE, "moderation is not run"),
    "service_tier": ((None, "auto", "default"), "one service tier only: auto"),
    "include_reasoning": ((None, True), "the reasoning is always returned"),
    "echo": (_OFF, "the last message is not prepended to the reply"),
    "add_special_tokens": (_OFF, "the chat template writes every special token"),
    "chat_template": (_NONE, "prompts are rendered by the served model's own chat template"),
    "documents": (_NONE, "documents are not passed to the chat template"),
    "media_io_kwargs": (_NONE, "multimodal input is not supported (text only)"),
    "mm_processor_kwargs": (_NONE, "multimodal input is not supported (text only)"),
    "return_prompt_text": (_OFF, "the prompt text is not returned (its token IDs can be)"),
}
_COMPLETION: dict[str, tuple[tuple[Any, ...], str]] = {
    "prompt_embeds": (_NONE, "prompt embeddings are not supported (text or token IDs)"),
}
REFUSED: dict[type, dict[str, tuple[tuple[Any, ...], str]]] = {
    ChatCompletionRequest: _COMMON | _CHAT,
    CompletionRequest: _COMMON | _COMPLETION,
}
"""Request type -> field -> (the values accepted because they ask for nothing, why any other is
refused)."""


def _refuse(field: str, why: str) -> ProxyError:
    return ProxyError(
        f"{field} is not supported by this server: {why}",
        status=400,
        type="invalid_request_error",
        error_code="unsupported_parameter",
        param=field,
    )


def refuse_unsupported(req: ChatCompletionRequest | CompletionRequest) -> None:
    """400 naming the first field of `req` set to a value `REFUSED` does not accept (also
    `stream_options.continuous_usage_stats`, `structured_outputs.disable_additional_properties`
    and `.whitespace_pattern`, and a message's legacy `function_call`)."""
    for field, (accepted, why) in REFUSED[type(req)].items():
        if getattr(req, field) not in accepted:
            raise _refuse(field, why)
    nested = [
        (
            "stream_options.continuous_usage_stats",
            req.stream_options and req.stream_options.continuous_usage_stats,
            "usage is sent once, after the last choice",
        ),
        (
            "structured_outputs.disable_additional_properties",
            req.structured_outputs and req.structured_outputs.disable_additional_properties,
            "a schema is enforced as sent",
        ),
        (
            "structured_outputs.whitespace_pattern",
            req.structured_outputs and req.structured_outputs.whitespace_pattern,
            "JSON is compiled without free whitespace",
        ),
    ]
    if isinstance(req, ChatCompletionRequest):
        nested += [
            (f"messages[{i}].function_call", m.function_call, "send the call in tool_calls")
            for i, m in enumerate(req.messages)
        ]
    for field, value, why in nested:
        if value not in _OFF:
            raise _refuse(field, why)


_UNKNOWN = re.compile(r"^Object contains unknown field `([^`]+)`(?: - at `\$\.?([^`]*)`)?$")


def unknown_field(message: str) -> ProxyError | None:
    """The 400 for msgspec's validation error `message` when it is about a field the request's
    schema does not list (None for any other error): such a field is refused, never ignored."""
    m = _UNKNOWN.match(message)
    if m is None:
        return None
    field = f"{m[2]}.{m[1]}" if m[2] else m[1]
    return ProxyError(
        f"{field} is not supported by this server (gyre refuses a field it does not know rather "
        "than ignore it)",
        status=400,
        type="invalid_request_error",
        error_code="unsupported_parameter",
        param=field,
    )
