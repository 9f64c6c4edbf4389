"""JSON inside a reply's text: decoding that knows where strings end, and what can be passed on.

Owns `decode_json_at` (the JSON value that starts at an offset of a text: a decoder, not a search
for the next tag, so a `</tool_call>` inside a string argument does not end the call, field case
B33), `loads_json` (a whole text), `check_json` (the rule every tool call's arguments meet before
the proxy passes them on: I-JSON, RFC 7493: no NaN or Infinity, no number beyond a double, no lone
surrogate escape such as `"\\ud83d"` (B37: no UTF-8 body can carry one, and gyre's own request
decoder refuses it when the client echoes it back), no member name twice in an object, at most
`MAX_DEPTH` levels; a call that breaks it is a malformed call, reported, never a 500) and
`shield` (`Shielded`: every marker text inside a JSON string literal of a reply rewritten into
the equivalent escape, `<` as `\\u003c`, so a parser that reads tags in the text, e.g. one of
vLLM's, cannot take it for the marker; what the parser returns is mapped back to the model's own
text). `lone_surrogate_path` says where a
decoded request body holds a lone surrogate (its 400 names that field). Knows nothing about
model formats, tokens or HTTP.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_DEPTH",
    "decode_json_at",
    "skip_ws",
    "loads_json",
    "check_json",
    "lone_surrogate_path",
    "Shielded",
    "shield",
]

MAX_DEPTH = 128
"""Deepest nesting of objects and arrays a tool call's arguments may have."""

_WS = re.compile(r"[ \t\n\r]*")  # JSON's whitespace (RFC 8259, section 2)
_SURROGATE = re.compile("[\ud800-\udfff]")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise ValueError(f"number {text[:40]} is beyond a double")
    return x


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for name, value in pairs:
        if name in obj:
            raise ValueError(f"duplicate member name {name!r} in a JSON object")
        obj[name] = value
    return obj


_DECODER = json.JSONDecoder(
    parse_constant=_no_constant, parse_float=_finite, object_pairs_hook=_unique_members
)
"""I-JSON's decoder: what `check_json` cannot see once decoded, a repeated member name (RFC 7493
section 2.3; Python keeps the last), is refused while decoding."""
_SCAN = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)
"""Where JSON objects lie in a text (`shield`): every object a parser may read, even one whose
names repeat."""


def check_json(value: Any) -> None:
    """Raise ValueError unless `value` (a decoded JSON value) can be passed on as I-JSON: no
    string or key holding a lone surrogate, no float beyond a double, at most `MAX_DEPTH`
    levels. Iterative, so any depth is checked without recursion."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            m = _SURROGATE.search(v)
            if m is not None:
                raise ValueError(
                    f"lone surrogate escape \\u{ord(m.group()):04x} is not a Unicode character"
                )
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise ValueError(f"{v} is not a JSON number")
        elif isinstance(v, dict | list):
            if depth >= MAX_DEPTH:
                raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels")
            items = [*v.keys(), *v.values()] if isinstance(v, dict) else v
            stack.extend((x, depth + 1) for x in items)


def lone_surrogate_path(value: Any) -> str | None:
    """The JSON path (`messages[0].content`; "" for the value itself) of the first string, in
    document order, that holds a lone surrogate, or of the object whose member name does; None
    when there is none. `value` is what a decoder that accepts lone surrogate escapes (Python's)
    made of a body; the path is ASCII-safe (a surrogate in a name is written as its escape)."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        v, path = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                return path
        elif isinstance(v, dict):
            if any(isinstance(k, str) and _SURROGATE.search(k) for k in v):
                return path
            stack.extend((x, f"{path}.{k}" if path else k) for k, x in reversed(list(v.items())))
        elif isinstance(v, list):
            stack.extend((x, f"{path}[{i}]") for i, x in reversed(list(enumerate(v))))
    return None


def decode_json_at(text: str, pos: int) -> tuple[Any, int]:
    """(value, end) of the JSON value that starts exactly at `text[pos]`, checked by
    `check_json`. Raises ValueError for text that is not such a value (or nests past the
    decoder's recursion limit)."""
    try:
        value, end = _DECODER.raw_decode(text, pos)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    check_json(value)
    return value, end


def skip_ws(text: str, pos: int) -> int:
    """The first offset at or after `pos` that is not JSON whitespace."""
    m = _WS.match(text, pos)
    return pos if m is None else m.end()


def loads_json(text: str) -> Any:
    """The JSON value `text` holds (whitespace around it allowed), checked by `check_json`."""
    value, end = decode_json_at(text, skip_ws(text, 0))
    if skip_ws(text, end) != len(text):
        raise ValueError(f"extra data after the JSON value at char {end}")
    return value


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_ESCAPE = re.compile(r"\\(?:u[0-9a-fA-F]{4}|.)", re.DOTALL)


def _string_literals(text: str, start: int, end: int) -> Iterable[tuple[int, int]]:
    """(first, last + 1) offsets of the contents of every string literal in the valid JSON
    `text[start:end]`."""
    for m in _STRING.finditer(text, start, end):
        yield m.start() + 1, m.end() - 1


def _escape(ch: str) -> str:
    return f"\\u{ord(ch):04x}"


@dataclass(frozen=True, slots=True)
class Shielded:
    """A reply's text with every marker inside a JSON string literal escaped (`shield`)."""

    text: str
    """The shielded text: the same JSON values, no marker inside a string."""
    original: str
    """The model's own text."""
    marks: tuple[int, ...]
    """Offsets in `text` where an escape (6 characters for 1) was written, ascending."""
    markers: tuple[str, ...]

    def restore(self, s: str | None) -> str | None:
        """`s`, a piece of what a parser returned for `text`, in the model's own characters:
        where `s` is a slice of `text` that slice of `original`; otherwise (the parser rewrote
        it) each escaped marker written back as the marker (the same JSON value)."""
        if s is None or not self.marks or "\\u" not in s:
            return s
        at = self.text.find(s)
        if at >= 0:
            lo, hi = self._orig(at), self._orig(at + len(s))
            if lo is not None and hi is not None:
                return self.original[lo:hi]
        for m in self.markers:
            s = s.replace(_escape(m[0]) + m[1:], m)
        return s

    def _orig(self, i: int) -> int | None:
        """The offset in `original` of offset `i` of `text` (None inside an escape)."""
        shift = 0
        for mark in self.marks:
            if i <= mark:
                break
            if i < mark + 6:
                return None
            shift += 5
        return i - shift


def shield(text: str, markers: Iterable[str]) -> Shielded:
    """`text` with every occurrence of a marker inside a string literal of a JSON object in it
    written with its first character escaped. JSON objects are found as a string-aware decoder
    finds them: from each `{` not inside an object already found; text that is not JSON is left
    as it is (a marker in prose is still a marker)."""
    found = tuple(
        sorted(
            {m for m in markers if m and ord(m[0]) <= 0xFFFF and '"' not in m and "\\" not in m},
            key=len,
        )
    )
    if not found or not any(m in text for m in found):
        return Shielded(text, text, (), found)
    pattern = re.compile("|".join(re.escape(m) for m in reversed(found)))
    edits: list[int] = []  # offsets in `text` of each marker's first character
    pos = text.find("{")
    while pos >= 0:
        try:
            _, end = _SCAN.raw_decode(text, pos)
        except (ValueError, RecursionError):
            pos = text.find("{", pos + 1)
            continue
        for a, b in _string_literals(text, pos, end):
            escapes = _ESCAPE.finditer(text, a, b)  # in step with the matches
            esc = next(escapes, None)
            for m in pattern.finditer(text, a, b):
                while esc is not None and esc.end() <= m.start():
                    esc = next(escapes, None)
                if esc is None or esc.start() > m.start():  # not inside an escape sequence
                    edits.append(m.start())
        pos = text.find("{", end)
    if not edits:
        return Shielded(text, text, (), found)
    out, marks, last = [], [], 0
    for i, e in enumerate(edits):
        out += [text[last:e], _escape(text[e])]
        marks.append(e + 5 * i)
        last = e + 1
    out.append(text[last:])
    return Shielded("".join(out), text, tuple(marks), found)
