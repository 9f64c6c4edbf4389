"""History healing: which differences between a client's history and the recorded calls are client
habits the proxy heals by reusing the recorded tokens (docs/design.md invariant 1).

Owns the reasons (`HEAL_REASONS`); `heal_echo` (an echoed assistant message with the fields a
client habitually changes taken back from the reply the proxy returned) and `echo_heals` (whether
the echo then renders as that reply); `json_equal` (two JSON values equal, type for type); and the
U+FFFD rules: `invalid_utf8_length` (the bytes Python's UTF-8 decoder replaces by one U+FFFD at a
position), `has_invalid_utf8`, `match_replacements` and `text_offset` (known token bytes matched
to a text that has U+FFFD in their place). The rules are conservative: a difference heals only
when, with the healed fields the reply's again, nothing the chat template renders differs. Knows
nothing about token IDs, HTTP or engines; `gyre.tito.render` applies the rules.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable
from typing import Any

import msgspec

from gyre.tito.wire import ChatMessage, ToolCall

__all__ = [
    "HEAL_REASONS",
    "heal_echo",
    "echo_heals",
    "json_equal",
    "invalid_utf8_length",
    "has_invalid_utf8",
    "REPLACEMENT_BYTES",
    "match_replacements",
    "text_offset",
]

HEAL_REASONS: tuple[str, ...] = (
    "reasoning_dropped",
    "tool_arguments_reserialized",
    "invalid_utf8",
    "reply_dropped",
)
"""Why a call's prompt could reuse the recorded tokens although the client's history differs:

- `reasoning_dropped`: an echoed reply without its reasoning (absent or empty), as the OpenAI
  Agents SDK, LangChain and gyre's reference agent send it;
- `tool_arguments_reserialized`: tool-call arguments that are the same JSON value in other text
  (spacing, key order, escapes: LangChain re-serialises them);
- `invalid_utf8`: the recorded completion's bytes are not valid UTF-8; the reply carried U+FFFD
  for them (`bytes.decode(errors="replace")`) and the client echoed that;
- `reply_dropped`: the client left out the last reply of a branch it abandoned (mini-swe-agent
  drops replies it rejects) and went on from the messages before it.
"""

REPLACEMENT_BYTES = "\ufffd".encode()
"""U+FFFD in UTF-8 (`EF BF BD`): what a client echoes for each maximal invalid subpart."""


def json_equal(a: Any, b: Any) -> bool:
    """Whether two decoded JSON values are the same value, type for type: `1`, `1.0` and `true`
    differ (Python's `==` says they are equal); object key order does not matter."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(json_equal(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    return a == b


_NOT_JSON = object()


def _json_value(arguments: str | dict[str, Any]) -> Any:
    """Tool-call arguments as a JSON value (an object sent as such is one already); `_NOT_JSON`
    for text that does not parse."""
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments)
    except ValueError:
        return _NOT_JSON


def _reasoning(m: ChatMessage) -> str | None:
    return m.reasoning_content if m.reasoning_content is not None else m.reasoning


def _heal_calls(
    echo: list[ToolCall] | None, reply: list[ToolCall] | None
) -> tuple[list[ToolCall] | None, bool]:
    """The echoed tool calls with each call's arguments taken back from the reply where the two
    are equal JSON values in different text, and whether any was; the echo itself when the calls
    differ otherwise (count, names) or not at all."""
    if not echo or not reply or len(echo) != len(reply):
        return echo, False
    out, healed = [], False
    for e, r in zip(echo, reply):
        ea, ra = e.function.arguments, r.function.arguments
        if e.function.name == r.function.name and ea != ra:
            ev = _json_value(ea)
            if ev is not _NOT_JSON and json_equal(ev, _json_value(ra)):
                fn = msgspec.structs.replace(e.function, arguments=ra)
                e, healed = msgspec.structs.replace(e, function=fn), True
        out.append(e)
    return (out, True) if healed else (echo, False)


def heal_echo(echo: ChatMessage, reply: ChatMessage | None) -> tuple[ChatMessage, tuple[str, ...]]:
    """`echo` (an assistant message a client sent back) with the fields it habitually changes
    taken back from `reply` (the message the proxy returned for that turn), and the reasons
    (`HEAL_REASONS` order; empty when nothing was taken back).

    Taken back: the reasoning, when the echo's is absent or empty and the reply had some
    (`reasoning_dropped`); a tool call's arguments, when the echo's call has the reply's name at
    the same position and its arguments are the same JSON value in other text
    (`tool_arguments_reserialized`). Every other field stays the echo's, so a caller compares
    the result with `reply` to know whether the echo differs in nothing else.
    """
    if reply is None or echo.role != "assistant" or reply.role != "assistant":
        return echo, ()
    reasons: list[str] = []
    fields: dict[str, Any] = {}
    if not _reasoning(echo) and _reasoning(reply):
        fields["reasoning_content"] = reply.reasoning_content
        fields["reasoning"] = reply.reasoning
        reasons.append("reasoning_dropped")
    calls, healed = _heal_calls(echo.tool_calls, reply.tool_calls)
    if healed:
        fields["tool_calls"] = calls
        reasons.append("tool_arguments_reserialized")
    if not fields:
        return echo, ()
    return msgspec.structs.replace(echo, **fields), tuple(reasons)


def echo_heals(
    echo: ChatMessage,
    reply: ChatMessage,
    to_template: Callable[[ChatMessage], dict[str, Any]],
    render: Callable[[ChatMessage], str],
) -> tuple[str, ...] | None:
    """The reasons `echo` heals to `reply` for, or None when it does not: `heal_echo` takes the
    habitually changed fields back from `reply`, and then nothing the chat template renders may
    differ: the same template input (`to_template`, gyre's message-to-template dict), or failing
    that the same text (`render`: the template's text of the message after one user message; a
    template that raises for either renders nothing to compare)."""
    fixed, reasons = heal_echo(echo, reply)
    if not reasons:
        return None
    if to_template(fixed) == to_template(reply):
        return reasons
    try:
        same = render(fixed) == render(reply)
    except Exception:  # jinja raises its own errors for messages a template rejects
        return None
    return reasons if same else None


def invalid_utf8_length(data: bytes, pos: int) -> int:
    """Bytes of `data` at `pos` that `data.decode("utf-8", errors="replace")` replaces by one
    U+FFFD (a maximal invalid subpart, at most 3 bytes: Unicode 15, section 3.9, "U+FFFD
    Substitution of Maximal Subparts"); 0 when a valid character (or nothing) starts there."""
    chunk = data[pos : pos + 4]  # a maximal subpart is at most 3 bytes; one more ends it
    try:
        codecs.utf_8_decode(chunk, "strict", True)
    except UnicodeDecodeError as exc:
        return exc.end - exc.start if exc.start == 0 else 0
    return 0


def has_invalid_utf8(data: bytes) -> bool:
    """Whether `data` is not valid UTF-8 (its decoded text then holds U+FFFD it did not)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def match_replacements(
    known: bytes, text: bytes, shared: int
) -> tuple[int, int, list[tuple[int, int]]]:
    """Carry a common prefix of `known` (the bytes of known tokens) and `text` (UTF-8) of
    `shared` bytes on across every U+FFFD of `text` that stands for an invalid sequence of
    `known` (`invalid_utf8_length`). Returns (bytes of `known` matched, bytes of `text` matched,
    the (start, end) in `known` of each invalid sequence so matched, in order)."""
    pk = pt = shared
    spans: list[tuple[int, int]] = []
    while pt < len(text):
        back = 0  # the shared bytes may end inside the text's character: go to its start
        while back < 3 and back < pt and (text[pt - back] & 0xC0) == 0x80:
            back += 1
        start_k, start_t = pk - back, pt - back
        if start_k >= len(known) or text[start_t : start_t + 3] != REPLACEMENT_BYTES:
            break
        bad = invalid_utf8_length(known, start_k)
        if not bad:
            break
        spans.append((start_k, start_k + bad))
        pk, pt = start_k + bad, start_t + 3
        n = min(len(known) - pk, len(text) - pt)
        same = _run(known, text, pk, pt, n)
        pk, pt = pk + same, pt + same
    return pk, pt, spans


def _run(a: bytes, b: bytes, i: int, j: int, n: int) -> int:
    """Length of the common run of `a[i:]` and `b[j:]`, at most `n` (halving slice compares)."""
    if a[i : i + n] == b[j : j + n]:
        return n
    lo, hi = 0, n
    while hi - lo > 1:  # a[i:i+lo] == b[j:j+lo], a[i:i+hi] != b[j:j+hi]
        mid = (lo + hi) // 2
        if a[i + lo : i + mid] == b[j + lo : j + mid]:
            lo = mid
        else:
            hi = mid
    return lo


def text_offset(pos: int, spans: list[tuple[int, int]]) -> int | None:
    """Where byte `pos` of the known bytes lands in the text `match_replacements` matched them
    with (each span of invalid bytes became the 3 bytes of U+FFFD); None inside a span."""
    off = pos
    for start, end in spans:
        if end <= pos:
            off += 3 - (end - start)
        elif start < pos:
            return None
        else:
            break
    return off
