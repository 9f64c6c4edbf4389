"""The Anthropic Messages API (`POST /v1/messages`) as a `ChatApi`: one more shape of a chat call.

Owns the request Structs (`MessagesRequest` and its content blocks; `CountTokensRequest`, the
body of `count_tokens`: the same conversation without sampling), `to_chat` (a Messages request
to the `ChatCompletionRequest` it means, with the protocol's checks) and `AnthropicMessages`, the
`ChatApi` (its answers and events are written by `anthropic_format`). The reply the proxy
records is the chat `ChatMessage` of `openai_format.reply_message`; a history echoed back in this
API translates to that same message (thinking -> `reasoning_content`, `tool_use` -> a tool call
with the model's exact argument text), so every API drives one execution path. Protocol reference:
the Anthropic API reference ("Messages", "Streaming Messages", "Errors") and the `anthropic` SDK's
types. Knows nothing about routes, keys, engines or the call log.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Literal

import msgspec

from gyre.tito.anthropic_format import anthropic_error, message_body, message_stream
from gyre.tito.chat_api import Reply
from gyre.tito.constraints import check_json_schema
from gyre.tito.detok import TokenText
from gyre.tito.generation import Call, Choice
from gyre.tito.openai_requests import malformed_body, param_of, proxy_error, template_kwargs
from gyre.tito.recorder import Recorder
from gyre.tito.reply import loads_or_none
from gyre.tito.request_fields import unknown_field
from gyre.tito.sessions import Execution
from gyre.tito.wire import (
    JSON_ENCODER,
    ChatCompletionRequest,
    ChatMessage,
    ContentPart,
    FunctionCall,
    ResponseFormat,
    ToolCall,
)

__all__ = [
    "TextBlock",
    "ImageBlock",
    "DocumentBlock",
    "DirectCaller",
    "ToolUseBlock",
    "ToolResultBlock",
    "ThinkingBlock",
    "RedactedThinkingBlock",
    "InputMessage",
    "Tool",
    "ToolChoice",
    "ThinkingConfig",
    "Metadata",
    "OutputFormat",
    "OutputConfig",
    "CountTokensRequest",
    "MessagesRequest",
    "to_chat",
    "AnthropicMessages",
]

TOOL_ERROR_PREFIX = "Error: "
"""How a `tool_result` with `is_error: true` reaches the chat template, whose tool turn has no
error flag: its text, after this prefix."""


class _Block(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="type", forbid_unknown_fields=True
):
    cache_control: dict[str, Any] | None = None
    """A prompt-caching breakpoint: accepted and without effect, since the proxy reuses every
    known prefix of an execution anyway."""


class TextBlock(_Block, tag="text", frozen=True):
    """A `text` content block."""

    text: str
    citations: None = None
    """Citations are not produced, so an echoed block carries none (null only)."""


class ImageBlock(_Block, tag="image", forbid_unknown_fields=False, frozen=True):
    """Decoded only to be refused with a clear 400 (the served models read text only)."""


class DocumentBlock(_Block, tag="document", forbid_unknown_fields=False, frozen=True):
    """Decoded only to be refused with a clear 400."""


class DirectCaller(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`{"type": "direct"}`: the model itself called the tool (the only caller this server
    produces; a server-tool caller is refused)."""

    type: Literal["direct"]


class ToolUseBlock(_Block, tag="tool_use", frozen=True):
    """A `tool_use` block the assistant sent: the call `id`, tool `name` and its `input` object."""

    id: str
    name: str
    input: dict[str, Any]
    caller: DirectCaller | None = None
    """Echoed by the anthropic SDK (`ToolUseBlock.caller`, null or direct)."""
    toolset_name: None = None
    """Echoed by the anthropic SDK (`ToolUseBlock.toolset_name`); toolsets are not served, so
    null only."""


class ToolResultBlock(_Block, tag="tool_result", frozen=True):
    """A `tool_result` block of a user turn: the result of call `tool_use_id` (`is_error`: reaches
    the model with `TOOL_ERROR_PREFIX`)."""

    tool_use_id: str
    content: str | list[TextBlock | ImageBlock | DocumentBlock] | None = None
    is_error: bool = False


class ThinkingBlock(_Block, tag="thinking", frozen=True):
    """A `thinking` block the assistant sent (its text is compared with the recorded reasoning)."""

    thinking: str
    signature: str | None = None
    """Not checked: gyre compares the thinking text itself with what it recorded."""


class RedactedThinkingBlock(_Block, tag="redacted_thinking", frozen=True):
    """Decoded only to be refused with a clear 400 (gyre never redacts what it recorded)."""

    data: str


Block = (
    TextBlock
    | ImageBlock
    | DocumentBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock
)


class InputMessage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One turn of `messages`: its role and a string or a list of blocks."""

    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A client tool: `{"name", "description", "input_schema"}` (server tools are refused)."""

    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None


class ToolChoice(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`tool_choice`: `auto`, `any`, `tool` (with `name`) or `none`, as chat auto / required /
    named / none."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class ThinkingConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`thinking`: `enabled` with `budget_tokens` (checked against the API's rules, not enforced),
    `adaptive` or `disabled`."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class Metadata(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`metadata`: the caller's `user_id`, accepted and not used for generation."""

    user_id: str | None = None
    """An opaque end-user ID: accepted, never affects generation."""


class OutputFormat(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`output_config.format`: the reply is JSON matching `schema` (as chat's `response_format`
    `json_schema`)."""

    type: Literal["json_schema"]
    schema: dict[str, Any]


class OutputConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`output_config`: `effort` reaches the chat template as a reasoning effort
    (`openai_requests.template_kwargs`), `format` constrains the reply."""

    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormat | None = None


class CountTokensRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/messages/count_tokens` body (the SDK's `MessageCountTokensParams`): what a
    Messages request renders, no sampling field (`max_tokens` included). An unknown field is a
    400 (docs/request_fields.md)."""

    model: str
    messages: list[InputMessage]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    # Without effect on what is sampled or returned: a cache breakpoint (every known prefix is
    # reused anyway), a speed hint, identifiers.
    cache_control: dict[str, Any] | None = None
    speed: Literal["standard", "fast"] | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None


class MessagesRequest(CountTokensRequest, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/messages` body: the conversation `CountTokensRequest` holds, and sampling.
    Every field is honoured, without effect on what is sampled or returned, or refused: an
    unknown field is a 400 (docs/request_fields.md)."""

    max_tokens: int
    temperature: float | None = None
    """In [0, 1] (the API's range; default 1)."""
    top_p: float | None = None
    top_k: int | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    """Without effect, as `inference_geo`: capacity and region hints."""
    inference_geo: str | None = None


_DECODER = msgspec.json.Decoder(MessagesRequest)
_COUNT_DECODER = msgspec.json.Decoder(CountTokensRequest)
_BLOCK_TYPES = "text, tool_use, tool_result, thinking"
_INVALID_TAG = re.compile(r"Invalid value '(.*)' - at `\$\.(.*\.type)`")


def _bad(message: str, param: str | None = None) -> Exception:
    return proxy_error(message, 400, "invalid_value", param=param, type="invalid_request_error")


def _decode(body: bytes, decoder: msgspec.json.Decoder = _DECODER) -> Any:
    """The request, or a 400 naming the offending field (msgspec's JSON path)."""
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        text = str(exc)
        if m := _INVALID_TAG.search(text):
            text = f"content block type {m[1]!r} is not supported (supported: {_BLOCK_TYPES})"
        unknown = unknown_field(text)
        if unknown is not None:
            raise _bad(f"invalid request: {unknown}", unknown.param) from None
        param = param_of(str(exc))  # named in the message: Anthropic's errors have no param
        where = f"{param}: " if param and param not in text else ""
        raise _bad(f"invalid request: {where}{text}", param) from None
    except msgspec.DecodeError as exc:
        raise malformed_body(body, exc) from None
    except RecursionError:
        raise _bad("malformed JSON body: nested too deeply") from None


def _texts(blocks: list, where: str) -> list[str]:
    """The text of text blocks (a tool result's or the system prompt's); 400 for any other."""
    out = []
    for b in blocks:
        if not isinstance(b, TextBlock):
            raise _bad(
                f"{where}: {b.__struct_config__.tag!r} blocks are not supported (text only)", where
            )
        out.append(b.text)
    return out


def _content(texts: list[str]) -> str | list[ContentPart]:
    """One text as a string, several as text parts (the chat path joins them)."""
    return texts[0] if len(texts) == 1 else [ContentPart(type="text", text=t) for t in texts]


def _assistant(blocks: list, at: str, known_args: dict[str, str]) -> tuple[ChatMessage, list[str]]:
    """One assistant turn as one chat message, and its tool_use IDs. Blocks must come in the
    order a reply has them: one thinking block, text, tool_use blocks."""
    reasoning: str | None = None
    texts: list[str] = []
    calls: list[ToolCall] = []
    call_ids: list[str] = []
    for b in blocks:
        if isinstance(b, ThinkingBlock):
            if reasoning is not None or texts or calls:
                raise _bad(f"{at}: one thinking block per turn, before its text and tool_use", at)
            reasoning = b.thinking
        elif isinstance(b, TextBlock):
            if calls:
                raise _bad(f"{at}: text after a tool_use block cannot be rendered in order", at)
            texts.append(b.text)
        elif isinstance(b, ToolUseBlock):
            raw = known_args.get(b.id)
            if raw is None or loads_or_none(raw) != b.input:
                raw = json.dumps(b.input, ensure_ascii=False)
            calls.append(ToolCall(id=b.id, function=FunctionCall(name=b.name, arguments=raw)))
            call_ids.append(b.id)
        elif isinstance(b, RedactedThinkingBlock):
            raise _bad(
                f"{at}: redacted_thinking holds another model's encrypted reasoning, which "
                "cannot be rendered for this model",
                at,
            )
        else:
            raise _bad(
                f"{at}: {b.__struct_config__.tag} blocks are not allowed from the assistant", at
            )
    text = "".join(texts)
    message = ChatMessage(
        role="assistant",
        content=text if text or not calls else None,  # as `reply_message` writes it
        reasoning_content=reasoning,
        tool_calls=calls or None,
    )
    return message, call_ids


def _user(blocks: list, at: str, pending: list[str]) -> list[ChatMessage]:
    """One user turn: its tool_result blocks as tool messages in order, then its text. Every
    tool_use of the turn before must get its result here, and no other."""
    out: list[ChatMessage] = []
    texts: list[str] = []
    answered: list[str] = []
    for b in blocks:
        if isinstance(b, ToolResultBlock):
            if texts:
                raise _bad(f"{at}: tool_result blocks must come before any text", at)
            if b.tool_use_id not in pending or b.tool_use_id in answered:
                raise _bad(
                    f"{at}: tool_result for {b.tool_use_id!r} answers no tool_use of the "
                    "assistant turn before it",
                    at,
                )
            answered.append(b.tool_use_id)
            content = b.content
            result = "".join(_texts(content, at)) if isinstance(content, list) else content or ""
            out.append(
                ChatMessage(
                    role="tool",
                    tool_call_id=b.tool_use_id,
                    content=TOOL_ERROR_PREFIX + result if b.is_error else result,
                )
            )
        elif isinstance(b, TextBlock):
            texts.append(b.text)
        else:
            raise _bad(
                f"{at}: {b.__struct_config__.tag} blocks are not supported in a user turn "
                "(text and tool_result only)",
                at,
            )
    missing = [i for i in pending if i not in answered]
    if missing:
        raise _bad(f"{at}: tool_use ids {missing} have no tool_result in the next user turn", at)
    if texts:
        out.append(ChatMessage(role="user", content=_content(texts)))
    if not out:
        raise _bad(f"{at}: a user turn needs content", at)
    return out


def _known_arguments(ex: Execution, ids: set[str]) -> dict[str, str]:
    """The exact argument text the proxy returned for each of these tool-call IDs (latest calls
    first), so an echoed `tool_use.input` re-renders to the tokens the model sampled."""
    found: dict[str, str] = {}
    for node in reversed(ex.render.nodes):
        if len(found) == len(ids):
            break
        for tc in (node.reply.tool_calls if node.reply is not None else None) or ():
            if tc.id in ids and isinstance(tc.function.arguments, str):
                found.setdefault(tc.id, tc.function.arguments)
    return found


def to_chat(
    req: CountTokensRequest, ex: Execution, *, thinking_switch: bool
) -> ChatCompletionRequest:
    """The chat request a Messages request means (a `CountTokensRequest`: without sampling).

    `system` becomes the first message; each assistant turn one assistant message
    (thinking -> `reasoning_content`, text -> content, tool_use -> tool calls); each user turn its
    tool results as tool messages in order, then its text. Raises ProxyError(400) for what the
    API refuses (an orphan or missing tool_result, an assistant turn last: prefill) and for what
    gyre cannot honour (images, documents, redacted thinking, server tools, a thinking switch
    the chat template lacks). `output_config.effort` reaches the template as a reasoning effort,
    `output_config.format` becomes `response_format`. `thinking_switch`: the template reads
    `enable_thinking`.
    """
    if not req.messages:
        raise _bad("messages must not be empty", "messages")
    if req.messages[-1].role != "user":
        raise _bad(
            "the last message must be a user turn (continuing an assistant prefill is not "
            "supported)",
            "messages",
        )
    sampling: dict[str, Any] = {}
    if isinstance(req, MessagesRequest):
        if req.temperature is not None and not 0 <= req.temperature <= 1:
            raise _bad(f"temperature={req.temperature} must be in [0, 1]", "temperature")
        sampling = dict(
            stream=req.stream,
            max_tokens=req.max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            stop=req.stop_sequences,
        )
        out_format = req.output_config.format if req.output_config is not None else None
        if out_format is not None:
            check_json_schema(out_format.schema, "output_config.format")
            sampling["response_format"] = ResponseFormat(
                type="json_schema", json_schema={"name": "output", "schema": out_format.schema}
            )
    out: list[ChatMessage] = []
    if req.system is not None:
        system = req.system if isinstance(req.system, str) else _texts(req.system, "system")
        out.append(
            ChatMessage(
                role="system", content=system if isinstance(system, str) else _content(system)
            )
        )
    used = {
        b.id
        for m in req.messages
        if m.role == "assistant" and not isinstance(m.content, str)
        for b in m.content
        if isinstance(b, ToolUseBlock)
    }
    known = _known_arguments(ex, used) if used else {}
    pending: list[str] = []
    for i, m in enumerate(req.messages):
        at = f"messages[{i}]"
        blocks = [TextBlock(text=m.content)] if isinstance(m.content, str) else m.content
        if m.role == "assistant":
            if pending:
                raise _bad(f"{at}: tool_use ids {pending} have no tool_result before it", at)
            message, pending = _assistant(blocks, at, known)
            out.append(message)
        else:
            out.extend(_user(blocks, at, pending))
            pending = []
    tools = tool_choice = None
    if req.tools:
        tools = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.input_schema,
                }
                if t.description is not None
                else {"name": t.name, "parameters": t.input_schema},
            }
            for t in req.tools
        ]
    parallel = None
    if req.tool_choice is not None:
        tool_choice, parallel = _tool_choice(req.tool_choice, req.tools or [])
    effort = req.output_config.effort if req.output_config is not None else None
    return ChatCompletionRequest(
        model=req.model,
        messages=out,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        chat_template_kwargs=template_kwargs(_thinking_kwargs(req, thinking_switch), effort, None),
        **sampling,
    )


def _tool_choice(choice: ToolChoice, tools: list[Tool]) -> tuple[Any, bool | None]:
    """(chat `tool_choice`, `parallel_tool_calls`): auto -> auto, any -> required, tool ->
    the named function, none -> none."""
    if choice.type in ("any", "tool") and not tools:
        raise _bad(f"tool_choice {choice.type!r} needs tools", "tool_choice")
    if choice.type == "tool":
        if choice.name not in {t.name for t in tools}:
            raise _bad(f"tool_choice names {choice.name!r}, which is not in tools", "tool_choice")
        chat: Any = {"type": "function", "function": {"name": choice.name}}
    else:
        chat = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
    return chat, (False if choice.disable_parallel_tool_use else None)


def _thinking_kwargs(req: CountTokensRequest, switch: bool) -> dict[str, Any] | None:
    """`enable_thinking` for the chat template. `enabled` needs 1024 <= budget_tokens <
    max_tokens (the API's rule; a count has no `max_tokens`); the budget bounds nothing beyond
    `max_tokens`, which thinking and text share. `disabled` needs a template that reads
    `enable_thinking`."""
    t = req.thinking
    if t is None:
        return None
    if t.type == "enabled":
        cap = req.max_tokens if isinstance(req, MessagesRequest) else None
        if (
            t.budget_tokens is None
            or t.budget_tokens < 1024
            or (cap is not None and t.budget_tokens >= cap)
        ):
            raise _bad(
                f"thinking.budget_tokens={t.budget_tokens} must be >= 1024 and < max_tokens",
                "thinking.budget_tokens",
            )
    elif t.budget_tokens is not None:
        raise _bad("thinking.budget_tokens is only for type 'enabled'", "thinking.budget_tokens")
    if not switch:
        if t.type == "disabled":
            raise _bad(
                "thinking cannot be disabled: this model's chat template has no enable_thinking "
                "switch",
                "thinking",
            )
        return None
    return {"enable_thinking": t.type != "disabled"}


class AnthropicMessages:
    """The Anthropic Messages API (`POST /v1/messages`) on the TITO proxy: one choice per call
    (the API has no `n`).

    Args:
        text: the proxy's `TokenText` (stop sequences are found in the decoded completion).
        model: the served model name written into responses.
        chat_template: the tokenizer's chat template (does it read `enable_thinking`?).
    """

    def __init__(self, *, text: TokenText, model: str, chat_template: str | None = None) -> None:
        self.text, self.model = text, model
        self.thinking_switch = "enable_thinking" in (chat_template or "")

    def decode(self, body: bytes, ex: Execution) -> tuple[MessagesRequest, ChatCompletionRequest]:
        req = _decode(body)
        return req, to_chat(req, ex, thinking_switch=self.thinking_switch)

    def decode_count(self, body: bytes, ex: Execution) -> ChatCompletionRequest:
        """The chat request a `count_tokens` body means: the one a Messages request of the same
        conversation renders. Raises ProxyError(400) as `decode` does."""
        return to_chat(_decode(body, _COUNT_DECODER), ex, thinking_switch=self.thinking_switch)

    def answer(self, call: Call, native: MessagesRequest, replies: list[Reply]) -> bytes:
        body = message_body(call, replies[0][0], text=self.text, model=self.model)
        return JSON_ENCODER.encode(body)

    def stream(
        self,
        call: Call,
        native: MessagesRequest,
        events: AsyncIterator[tuple[Choice, int]],
        recorder: Recorder,
    ) -> AsyncGenerator[bytes, None]:
        return message_stream(call, events, text=self.text, model=self.model, recorder=recorder)

    def error_body(self, message: str, *, type: str, code: str | None, param: str | None) -> bytes:
        return anthropic_error(message, type=type, code=code, param=param)
