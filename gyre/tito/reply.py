"""Reply parsing in gyre's own format: a choice's text as reasoning, content and tool calls.

Owns `parse_reply` (the whole text to a `ParsedReply`; `split_reasoning` and `parse_calls` are its
two halves), `partial_reply` and `ReplyStream` (prefixes of that parse, safe to stream while the
text is still being generated) and `loads_or_none`. The tags are those the tiny model's template
renders (`<think>`, `<tool_call>`); a call's JSON is decoded from its opening brace, so a tag
inside a string argument is text (`gyre.tito.json_text`, B33), and tool-call arguments keep the
model's exact text, so a reply echoed back re-renders to the tokens the model sampled. Other
models' formats are parsed by vLLM's parsers (`gyre.tito.model_format`). Knows nothing about
tokens, templates, HTTP or engines.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from gyre.tito.json_text import decode_json_at, skip_ws
from gyre.tito.wire import FunctionCall, ToolCall

__all__ = [
    "ParsedReply",
    "parse_reply",
    "split_reasoning",
    "parse_calls",
    "partial_reply",
    "ReplyStream",
    "loads_or_none",
]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_CANONICAL_CALL = re.compile(r'\{"name": ("(?:[^"\\]|\\.)*"), "arguments": (.*)\}', re.DOTALL)


@dataclass(frozen=True, slots=True)
class ParsedReply:
    """The assistant message the proxy returns for one choice's text."""

    content: str | None
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...]
    tool_call_error: str | None
    """Set when the text holds a malformed `<tool_call>`: the text then stays `content` (B23)."""


def _hold(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag` (may still become
    it)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def split_reasoning(text: str) -> tuple[str | None, str, bool]:
    """(reasoning, rest, closed): `<think>R</think>\\n` is stripped from the start of `text`."""
    if not text.startswith(THINK_OPEN):
        return None, text, True
    j = text.find(THINK_CLOSE, len(THINK_OPEN))
    if j < 0:
        return text[len(THINK_OPEN) :], "", False
    rest = text[j + len(THINK_CLOSE) :]
    return text[len(THINK_OPEN) : j], rest[1:] if rest.startswith("\n") else rest, True


def _call(obj: Any, body: str, index: int, call_id: str) -> ToolCall:
    """The tool call of one decoded block; `body` is the block's exact JSON text."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError('a tool call must be a JSON object with a string "name"')
    args = obj.get("arguments", {})
    if not isinstance(args, dict):
        raise ValueError('"arguments" must be a JSON object')
    m = _CANONICAL_CALL.fullmatch(body)
    if (
        m is not None
        and json.loads(m.group(1)) == obj["name"]
        and loads_or_none(m.group(2)) == args
    ):
        raw = m.group(2)  # the model's exact argument text: re-rendered verbatim (B23)
    else:
        raw = json.dumps(args, ensure_ascii=False)
    return ToolCall(
        id=f"{call_id}_{index}",
        type="function",
        function=FunctionCall(name=obj["name"], arguments=raw),
    )


def loads_or_none(text: str) -> Any:
    """The JSON value of `text`, or None when it is not JSON (or nests past the decoder)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def parse_calls(rest: str, call_id: str) -> tuple[str, tuple[ToolCall, ...], str | None]:
    """(content, tool calls, error) of a reasoning-free text in gyre's format (`parse_reply`).

    Each block's JSON object is decoded from its opening brace by a decoder that knows where
    strings end (`json_text.decode_json_at`), so a `</tool_call>` (or any tag) inside a string
    argument is text (B33); the block ends at the first `</tool_call>` after the object."""
    i = rest.find(CALL_OPEN)
    if i < 0:
        return rest, (), None
    calls: list[ToolCall] = []
    prose = [rest[:i]]
    pos = i
    try:
        while pos >= 0:
            if rest.find(CALL_CLOSE, pos) < 0:
                raise ValueError("unterminated <tool_call>")
            start = skip_ws(rest, pos + len(CALL_OPEN))
            obj, end = decode_json_at(rest, start)
            close = skip_ws(rest, end)
            if not rest.startswith(CALL_CLOSE, close):
                raise ValueError(f"expected </tool_call> after the JSON object at char {end}")
            calls.append(_call(obj, rest[start:end], len(calls), call_id))
            after = close + len(CALL_CLOSE)
            pos = rest.find(CALL_OPEN, after)
            between = rest[after:] if pos < 0 else rest[after:pos]
            if between.strip():  # text between or after calls is content (B27)
                prose.append(between)
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        return rest, (), f"malformed tool call: {exc}"
    return "".join(prose), tuple(calls), None


def parse_reply(text: str, call_id: str = "call", *, tools: bool = True) -> ParsedReply:
    """Split a choice's visible text into reasoning, content and tool calls (gyre's format).

    `<think>R</think>\\n` at the start is reasoning. Every `<tool_call>{"name": ...,
    "arguments": {...}}</tool_call>` block is a tool call; the text before the first block, and
    any text between or after blocks that is not only whitespace, is content (field case B27:
    calls separated by newlines or followed by prose are still calls). Arguments keep the model's
    exact text when the call is written the way the template renders it. A block that is not
    such a JSON object, or is unterminated, is malformed: the whole text stays content and
    `tool_call_error` says why (the agent sees it; nothing is dropped). Tool call IDs are
    `<call_id>_<i>`. With `tools=False` (no tools offered) nothing is parsed as a tool call.
    """
    reasoning, rest, _ = split_reasoning(text)
    if not tools:
        return ParsedReply(content=rest, reasoning=reasoning, tool_calls=(), tool_call_error=None)
    content, calls, error = parse_calls(rest, call_id)
    return ParsedReply(
        content=content, reasoning=reasoning, tool_calls=calls, tool_call_error=error
    )


def partial_reply(text: str, *, tools: bool = True) -> tuple[str, str]:
    """(reasoning, content) of a text still being generated: prefixes of what `parse_reply` will
    return for any continuation, so they can be streamed without ever being taken back."""
    if len(text) < len(THINK_OPEN) and THINK_OPEN.startswith(text):
        return "", ""
    reasoning, rest, closed = split_reasoning(text)
    if reasoning is not None and not closed:
        return reasoning[: len(reasoning) - _hold(reasoning, THINK_CLOSE)], ""
    if reasoning is not None and text.endswith(THINK_CLOSE):
        return reasoning, ""  # the newline after </think> is not known yet
    if not tools:
        return reasoning or "", rest
    i = rest.find(CALL_OPEN)
    content = rest[:i] if i >= 0 else rest[: len(rest) - _hold(rest, CALL_OPEN)]
    return reasoning or "", content


class ReplyStream:
    """Incremental `partial_reply`: feed text pieces, get the reasoning and content to stream.

    Keeps only a tag-sized buffer, so streaming a completion costs O(its length), not O(length^2).
    What it emits is always a prefix of what `parse_reply` returns for the whole text; the caller
    sends the rest of the final parse when the choice ends.
    """

    def __init__(self, *, tools: bool = True) -> None:
        self.tools = tools
        self.mode = "start"
        self.buf = ""

    def feed(self, piece: str) -> tuple[str, str]:
        """(reasoning, content) newly safe to send after `piece`."""
        self.buf += piece
        reasoning, content = [], []
        while True:
            buf = self.buf
            if self.mode == "start":
                if len(buf) < len(THINK_OPEN) and THINK_OPEN.startswith(buf):
                    break
                if buf.startswith(THINK_OPEN):
                    self.buf, self.mode = buf[len(THINK_OPEN) :], "think"
                else:
                    self.mode = "content"
            elif self.mode == "think":
                j = buf.find(THINK_CLOSE)
                if j >= 0:
                    reasoning.append(buf[:j])
                    self.buf, self.mode = buf[j + len(THINK_CLOSE) :], "after_think"
                else:
                    keep = len(buf) - _hold(buf, THINK_CLOSE)
                    reasoning.append(buf[:keep])
                    self.buf = buf[keep:]
                    break
            elif self.mode == "after_think":
                if not buf:
                    break
                self.buf, self.mode = (buf[1:] if buf[0] == "\n" else buf), "content"
            elif self.mode == "content":
                i = buf.find(CALL_OPEN) if self.tools else -1
                if i >= 0:
                    content.append(buf[:i])
                    self.buf, self.mode = "", "held"
                    break
                keep = len(buf) - (_hold(buf, CALL_OPEN) if self.tools else 0)
                content.append(buf[:keep])
                self.buf = buf[keep:]
                break
            else:  # held: the rest is tool calls (or malformed): sent from the final parse
                self.buf = ""
                break
        return "".join(reasoning), "".join(content)
