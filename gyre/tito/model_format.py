"""Model formats: how the served model writes reasoning and tool calls, and which tokens end it.

Owns `ModelFormat` (one per proxy: the reply parser, the stop token IDs and the tool-call IDs it
mints, `ToolCallIds`), `GyreParser` (gyre's
own `<think>` + `<tool_call>{json}</tool_call>` format, `gyre.tito.reply`), `VllmParser` (vLLM's
own tool and reasoning parsers, chosen by name from `vllm.tool_parsers.ToolParserManager` and
`vllm.reasoning.ReasoningParserManager`: hermes, llama3_json, mistral, deepseek_v3, qwen3,
deepseek_r1, ...) and `generation_stop_ids` (the model's `generation_config.json` end IDs plus
the tokenizer's EOS). Every parser is JSON-aware: a marker inside a JSON string is text, and a
call that cannot be passed on as I-JSON is a reported malformed call (`gyre.tito.json_text`). vLLM
is imported only when one of its parsers is configured. Knows nothing about HTTP, engines or chat
templates.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gyre.errors import ConfigError
from gyre.tito.json_text import check_json, loads_json, shield
from gyre.tito.reply import (
    CALL_CLOSE,
    CALL_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    ParsedReply,
    ReplyStream,
    parse_calls,
    parse_reply,
    split_reasoning,
)
from gyre.tito.wire import FunctionCall, ToolCall

__all__ = [
    "ReplyParser",
    "TextStream",
    "GyreParser",
    "VllmParser",
    "HeldStream",
    "ModelFormat",
    "ToolCallIds",
    "TOOL_CALL_IDS",
    "generation_stop_ids",
    "check_parser_names",
]

GYRE = "gyre"
NONE = "none"


class TextStream(Protocol):
    """Streams one choice's reasoning and content while it is generated (`ReplyStream`)."""

    def feed(self, piece: str) -> tuple[str, str]:
        """(reasoning, content) newly safe to send after `piece`: always prefixes of what the
        parser's final `parse` returns for the whole text."""
        ...


class ReplyParser(Protocol):
    """Parses a choice's visible text into the assistant message the proxy returns."""

    name: str

    def parse(self, text: str, call_id: str, *, tools: list[dict[str, Any]] | None) -> ParsedReply:
        """The reply of `text`; `tools` is the request's tool list (None: parse no tool call).
        Tool call IDs are `<call_id>_<i>`."""
        ...

    def stream(self, *, tools: bool) -> TextStream:
        """A new stream for one choice (`tools`: tool calls are parsed)."""
        ...


class GyreParser:
    """gyre's own format (the tiny model's template): `gyre.tito.reply.parse_reply`."""

    name = GYRE

    def parse(self, text: str, call_id: str, *, tools: list[dict[str, Any]] | None) -> ParsedReply:
        return parse_reply(text, call_id, tools=bool(tools))

    def stream(self, *, tools: bool) -> TextStream:
        return ReplyStream(tools=tools)


class HeldStream:
    """Sends no text while the choice is generated (every delta still carries its token IDs and
    logprobs); the whole parse goes out when the choice ends. `passthrough`: nothing is parsed
    (no tools, no reasoning parser), so the text streams as content unchanged."""

    def __init__(self, *, passthrough: bool) -> None:
        self.passthrough = passthrough

    def feed(self, piece: str) -> tuple[str, str]:
        return ("", piece) if self.passthrough else ("", "")


class VllmParser:
    """Reasoning and tool calls parsed by vLLM's own parsers (`vllm serve --tool-call-parser
    NAME --reasoning-parser NAME`), non-streamed API: `ReasoningParser.extract_reasoning` first,
    then `ToolParser.extract_tool_calls` on the content.

    Args:
        tokenizer: the served model's `transformers` tokenizer (vLLM's parsers look their marker
            tokens up in its vocabulary).
        tool_parser: a `ToolParserManager` name, or `gyre` for gyre's `<tool_call>` blocks.
        reasoning_parser: a `ReasoningParserManager` name, `gyre` (`<think>` at the start) or
            `none`.

    Raises `ConfigError` for an unknown name or a tokenizer the parser cannot use (e.g. one
    without the parser's marker tokens). vLLM's parsers read markers in the text, some without
    knowing JSON strings (hermes ended a call at a `</tool_call>` inside an argument, qwen3's
    reasoning parser deleted `</think>` and `<|im_end|>` from one, Mistral's split a call at an
    inner `[TOOL_CALLS]`: B33), so they parse the text `json_text.shield` makes of it (markers
    inside JSON strings escaped) and what they return is mapped back. A call whose arguments
    are not a JSON object under `json_text.check_json` (a lone surrogate, B37; text cut where
    vLLM split it) is malformed: the text stays content and `tool_call_error` says why.
    Tool-call arguments are the text vLLM gives (its re-serialisation `json.dumps(arguments,
    ensure_ascii=False)` for most parsers, the model's own for some); tool call IDs are gyre's,
    not vLLM's random ones. Streaming holds text until the choice ends (`HeldStream`).
    """

    def __init__(self, tokenizer: Any, *, tool_parser: str, reasoning_parser: str) -> None:
        from vllm.reasoning import ReasoningParserManager
        from vllm.tool_parsers import ToolParserManager

        self.name = f"{tool_parser}+{reasoning_parser}"
        self.tokenizer = tokenizer
        self.markers = _markers(tokenizer)
        self.tool_cls = None if tool_parser == GYRE else _lookup(ToolParserManager, tool_parser)
        self.reasoning_name = reasoning_parser
        self.reasoning = None
        if reasoning_parser not in (GYRE, NONE):
            cls = _lookup(ReasoningParserManager, reasoning_parser, kind="reasoning_parser")
            try:
                self.reasoning = cls(tokenizer)
            except Exception as exc:  # vLLM raises several types for a missing marker token
                raise ConfigError(
                    f"reasoning_parser={reasoning_parser!r} cannot use this tokenizer: {exc}"
                ) from None
        self._requests: OrderedDict[str, tuple[Any, Any]] = OrderedDict()
        self._tools(None)  # fail at start-up, not on the first request, if the parser refuses

    def _tools(self, tools: list[dict[str, Any]] | None) -> tuple[Any, Any]:
        """(vLLM ChatCompletionRequest, tool parser) for a tool list; the last 32 are kept
        (a parser looks its markers up in the vocabulary when built)."""
        key = json.dumps(tools, sort_keys=True)
        hit = self._requests.get(key)
        if hit is not None:
            self._requests.move_to_end(key)
            return hit
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        # validated from plain data: pydantic turns the tool dicts into vLLM's tool params
        request = ChatCompletionRequest.model_validate(
            {"messages": [], "model": "gyre", "tools": tools}
        )
        parser = None
        if self.tool_cls is not None:
            try:
                parser = self.tool_cls(self.tokenizer, request.tools)
            except Exception as exc:  # vLLM raises RuntimeError/ValueError for missing markers
                raise ConfigError(
                    f"tool_parser {self.tool_cls.__name__} cannot use this tokenizer: {exc}"
                ) from None
        self._requests[key] = (request, parser)
        if len(self._requests) > 32:
            self._requests.popitem(last=False)
        return request, parser

    def parse(self, text: str, call_id: str, *, tools: list[dict[str, Any]] | None) -> ParsedReply:
        request, tool_parser = self._tools(tools or None)
        shielded = shield(text, self.markers)  # no marker inside a JSON string is a marker
        if self.reasoning is not None:
            reasoning, shielded_rest = self.reasoning.extract_reasoning(shielded.text, request)
            shielded_rest = shielded_rest or ""
        elif self.reasoning_name == GYRE:
            reasoning, shielded_rest, _ = split_reasoning(shielded.text)
        else:
            reasoning, shielded_rest = None, shielded.text
        reasoning, rest = shielded.restore(reasoning), shielded.restore(shielded_rest) or ""
        if not tools:
            return ParsedReply(
                content=rest, reasoning=reasoning, tool_calls=(), tool_call_error=None
            )
        if tool_parser is None:
            content, calls, error = parse_calls(rest, call_id)
            return ParsedReply(
                content=content, reasoning=reasoning, tool_calls=calls, tool_call_error=error
            )
        info = tool_parser.extract_tool_calls(shielded_rest, request)
        found = info.tool_calls if info.tools_called else ()
        try:
            calls = tuple(
                _checked_call(
                    f"{call_id}_{i}",
                    shielded.restore(tc.function.name),
                    shielded.restore(tc.function.arguments),
                )
                for i, tc in enumerate(found)
            )
        except ValueError as exc:  # the whole text stays content, as in gyre's format (B23)
            return ParsedReply(
                content=rest,
                reasoning=reasoning,
                tool_calls=(),
                tool_call_error=f"malformed tool call: {exc}",
            )
        said = shielded.restore(info.content)
        content = said if said is not None else ("" if calls else rest)
        return ParsedReply(
            content=content, reasoning=reasoning, tool_calls=calls, tool_call_error=None
        )

    def stream(self, *, tools: bool) -> TextStream:
        return HeldStream(passthrough=not tools and self.reasoning_name == NONE)


def _checked_call(call_id: str, name: Any, arguments: Any) -> ToolCall:
    """A call vLLM's parser found, as the proxy passes it on: a string name and arguments that
    are a JSON object under `json_text.check_json` (else ValueError: a malformed call)."""
    if not isinstance(name, str) or not isinstance(arguments, str):
        raise ValueError("a tool call needs a string name and arguments")
    check_json(name)
    if not isinstance(loads_json(arguments), dict):
        raise ValueError('"arguments" must be a JSON object')
    return ToolCall(
        id=call_id, type="function", function=FunctionCall(name=name, arguments=arguments)
    )


def _markers(tokenizer: Any) -> tuple[str, ...]:
    """The texts a vLLM parser may read as markers: the tokenizer's added tokens (control
    tokens, tool and reasoning tags) that are not plain words, and gyre's own tags."""
    added = [t for t in tokenizer.get_added_vocab() if t.strip() == t and not t.isalnum()]
    return tuple({*added, THINK_OPEN, THINK_CLOSE, CALL_OPEN, CALL_CLOSE})


def _lookup(manager: Any, name: str, *, kind: str = "tool_parser") -> type:
    """The parser class registered as `name` in a vLLM parser manager (ConfigError if none)."""
    get = manager.get_tool_parser if kind == "tool_parser" else manager.get_reasoning_parser
    try:
        return get(name)
    except KeyError:
        names = ", ".join(sorted({*manager.list_registered(), GYRE}))
        raise ConfigError(f"{kind}={name!r} is not one of: {names}") from None


def check_parser_names(tool_parser: str, reasoning_parser: str) -> None:
    """Raise `ConfigError` unless `tool_parser` is `gyre` or a name registered in vLLM's
    `ToolParserManager` and `reasoning_parser` is `gyre`, `none` or one registered in its
    `ReasoningParserManager`: the names alone, before a model or tokenizer exists (the run's
    preflight). `ModelFormat.load` checks them again with the tokenizer's marker tokens."""
    if tool_parser == NONE:
        raise ConfigError("tool_parser='none' is not a parser; use 'gyre' or a vLLM name")
    if tool_parser != GYRE:
        from vllm.tool_parsers import ToolParserManager

        _lookup(ToolParserManager, tool_parser)
    if reasoning_parser not in (GYRE, NONE):
        from vllm.reasoning import ReasoningParserManager

        _lookup(ReasoningParserManager, reasoning_parser, kind="reasoning_parser")


def generation_stop_ids(tokenizer: Any, model_dir: str | Path | None = None) -> tuple[int, ...]:
    """The IDs that end a reply: the tokenizer's EOS, then every `eos_token_id` of the model's
    `generation_config.json` (an int or a list, as transformers' `GenerationConfig` writes it),
    without repeats. `model_dir` defaults to the folder the tokenizer was loaded from
    (`tokenizer.name_or_path`); no such folder or file adds nothing. Raises `ConfigError` for
    an `eos_token_id` that is not IDs >= 0."""
    ids: list[int] = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    folder = model_dir if model_dir is not None else getattr(tokenizer, "name_or_path", "")
    path = Path(folder) / "generation_config.json" if folder else None
    if path is None or not path.is_file():
        return tuple(ids)
    eos = json.loads(path.read_text()).get("eos_token_id")
    for t in eos if isinstance(eos, list) else [] if eos is None else [eos]:
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise ConfigError(f"{path}: eos_token_id={eos!r} must be token IDs >= 0")
        if t not in ids:
            ids.append(t)
    return tuple(ids)


_ALNUM = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_SAFE_ID = re.compile(r"[A-Za-z0-9_-]{1,40}")
_CALL_ID = re.compile(r"c(\d+)(?:/(\d+))?")
_SPREAD = 2487947369287701
"""2^64 / golden ratio, modulo 62^9: odd and not a multiple of 31 (one to one onto 62^9 IDs),
large, so consecutive calls' IDs differ in every character."""


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:12], "big")


def _base62(value: int, width: int) -> str:
    digits = []
    for _ in range(width):
        value, r = divmod(value, 62)
        digits.append(_ALNUM[r])
    return "".join(reversed(digits))


@dataclass(frozen=True, slots=True)
class ToolCallIds:
    """The tool-call IDs the proxy mints for a model format, and the format's rule for them.

    An ID is a function of (execution, call, choice, position in the reply): the same call
    always gets the same IDs, and no two tool calls of one execution share one, so an ID the
    client echoes re-renders to the tokens recorded for it and never branches a tree.
    `openai` (every format but Mistral's): `call_<execution>_<call>_<i>`, or with a digest of
    the execution ID when that is not at most 40 characters of `[A-Za-z0-9_-]` (OpenAI's
    limit on a tool-call ID, the characters Anthropic allows in a `tool_use` ID). `mistral`: 9
    letters and digits, the only IDs Mistral's templates and mistral-common accept (B35): the
    call's number, its choice and position paired into one number, mapped one to one onto the
    62^9 IDs by an affine map keyed by the execution.
    """

    style: str = "openai"

    def mint(self, execution_id: str, call_id: str, index: int) -> str:
        """The ID of tool call `index` of call `call_id` (`c<k>`, or `c<k>/<choice>` when a
        request has several choices) of `execution_id`."""
        if self.style == "mistral":
            m = _CALL_ID.fullmatch(call_id)
            k, choice = (int(m[1]), int(m[2]) + 1 if m[2] else 0) if m else (_digest(call_id), 0)
            space = 62**9
            # Cantor pairing is one to one; 62^9 numbers hold k up to ~1.6e8 calls.
            inner = (choice + index) * (choice + index + 1) // 2 + index
            paired = (k + inner) * (k + inner + 1) // 2 + inner
            # _SPREAD is prime to 62 = 2 * 31, so the map is a bijection of [0, 62^9).
            mixed = (paired * _SPREAD + _digest(execution_id)) % space
            return _base62(mixed, 9)
        tool_id = f"call_{execution_id}_{call_id}_{index}".replace("/", "_")
        if _SAFE_ID.fullmatch(tool_id):
            return tool_id
        return f"call_{_base62(_digest(execution_id), 10)}_{call_id}_{index}".replace("/", "_")

    def valid(self, tool_id: str) -> bool:
        """Whether `tool_id` satisfies this format's rule."""
        if self.style == "mistral":
            return len(tool_id) == 9 and tool_id.isascii() and tool_id.isalnum()
        return _SAFE_ID.fullmatch(tool_id) is not None


TOOL_CALL_IDS = {"openai": ToolCallIds("openai"), "mistral": ToolCallIds("mistral")}
"""Every ID style, by name (`ModelFormat.load` picks `mistral` for vLLM's `mistral` parser)."""


@dataclass(frozen=True, slots=True)
class ModelFormat:
    """What the proxy knows of the served model's output format.

    `parser` turns a choice's text into reasoning, content and tool calls; `stop_token_ids`
    (`generation_stop_ids`) end every reply before the request's own; `tool_ids` names its tool
    calls.
    """

    parser: ReplyParser
    stop_token_ids: tuple[int, ...]
    tool_ids: ToolCallIds = TOOL_CALL_IDS["openai"]

    @classmethod
    def load(
        cls,
        tokenizer: Any,
        *,
        tool_parser: str = GYRE,
        reasoning_parser: str = GYRE,
        model_dir: str | Path | None = None,
    ) -> ModelFormat:
        """The format of `tokenizer`'s model. `gyre` + `gyre` is gyre's own parser (no vLLM
        import); any other name picks vLLM's parser of that name (`VllmParser`). Raises
        `ConfigError` for an unknown parser name or a tokenizer it cannot use."""
        if tool_parser == GYRE and reasoning_parser == GYRE:
            parser: ReplyParser = GyreParser()
        else:
            check_parser_names(tool_parser, reasoning_parser)
            parser = VllmParser(
                tokenizer, tool_parser=tool_parser, reasoning_parser=reasoning_parser
            )
        return cls(
            parser=parser,
            stop_token_ids=generation_stop_ids(tokenizer, model_dir),
            tool_ids=TOOL_CALL_IDS["mistral" if tool_parser == "mistral" else "openai"],
        )
