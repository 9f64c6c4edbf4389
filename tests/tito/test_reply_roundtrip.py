"""Property: a tool call written in a model format and parsed back is the same call, whatever its
argument strings hold (`gyre.tito.json_text`, docs/design.md "Model formats").

For gyre's own format and every family of `tests/tito/families.py` (through vLLM's parsers): the
call as the format's template renders it, tokenized as a model samples it, decoded and parsed by
the proxy's parser, gives back one `write_file` call with the same arguments, written as the
template wrote them (`json.dumps(arguments, ensure_ascii=False)`), and no error. Argument strings
hold any Unicode text, quotes, backslashes, escapes' look-alikes, and the tag and control-token
text of every format (`</tool_call>`, `<think>`, `<|im_end|>`, `[TOOL_CALLS]`, DeepSeek's
markers...). Bytes that are not UTF-8 (byte tokens sampled inside a string) come back as the
decoded text has them, U+FFFD per bad sequence. What no format can carry: a lone surrogate
escape (`"\\ud83d"`) is not a Unicode character, so no UTF-8 body can hold the string, and the
proxy reports the call as malformed on every format instead (B37); a paired escape is the
character it names. Every format here carries everything else.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gyre.model.recipe import build_tokenizer
from gyre.tito.json_text import shield
from tests.tito.families import FAMILIES
from tests.tito.written import (
    FORMATS,
    TOOL,
    TOOLS,
    byte_ids,
    format_parser,
    format_tokenizer,
    sampled_ids,
    write_call,
)

PROPERTY = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

MARKERS = sorted(
    {t for fam in FAMILIES.values() for t in fam.specials}
    | {"<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "[ARGS]"}
)
pieces = (
    st.sampled_from(MARKERS)
    | st.text(st.characters(exclude_categories=["Cs"]), max_size=6)
    | st.sampled_from(['"', "\\", '\\"', "\\u003c", "{", "}", "[", "]", "\n", "```", "```json\n"])
)
strings = st.lists(pieces, max_size=6).map("".join)
arguments = st.fixed_dictionaries({"path": strings, "content": strings})


@pytest.fixture(scope="module", params=FORMATS)
def fmt(request, tmp_path_factory):
    name = request.param
    tok = format_tokenizer(name, tmp_path_factory.mktemp(name))
    return name, tok, format_parser(name, tok)


def parse(tok, parser, ids: list[int]):
    return parser.parse(tok.decode(ids), "call", tools=TOOLS)


def test_any_argument_string_round_trips(fmt):
    name, tok, parser = fmt

    @PROPERTY
    @given(args=arguments)
    def one(args: dict) -> None:
        ids = sampled_ids(tok, name, write_call(tok, name, args))
        reply = parse(tok, parser, ids)
        assert reply.tool_call_error is None, (name, args, reply)
        assert [(c.function.name, json.loads(c.function.arguments)) for c in reply.tool_calls] == [
            (TOOL, args)
        ], (name, args, reply)
        assert reply.tool_calls[0].function.arguments == json.dumps(args, ensure_ascii=False)
        assert not reply.content, (name, reply)

    one()


high_bytes = st.lists(st.integers(0x80, 0xFF), min_size=1, max_size=6).map(bytes)
"""Bytes of no ASCII character (an ASCII byte is JSON syntax: a quote, a backslash, a newline
sampled inside a string make the call malformed JSON, as they should)."""


def test_bytes_that_are_not_utf8_come_back_as_decoded(fmt):
    """Byte tokens sampled inside a string argument: the call is the one whose string holds
    what the bytes decode to (`bytes.decode("utf-8", "replace")`, as the reply text does)."""
    name, tok, parser = fmt

    @PROPERTY
    @given(head=strings, raw=high_bytes)
    def one(head: str, raw: bytes) -> None:
        text = write_call(tok, name, {"path": "a", "content": head + "@"})
        before, after = text.rsplit("@", 1)  # the content is the last value written
        ids = sampled_ids(tok, name, before) + byte_ids(tok, raw) + sampled_ids(tok, name, after)
        reply = parse(tok, parser, ids)
        want = {"path": "a", "content": head + raw.decode("utf-8", errors="replace")}
        got = [(c.function.name, json.loads(c.function.arguments)) for c in reply.tool_calls]
        assert got == [(TOOL, want)] and reply.tool_call_error is None, (name, raw, reply)

    one()


surrogates = st.integers(0xD800, 0xDFFF)


def test_a_lone_surrogate_escape_is_a_reported_malformed_call(fmt):
    """No format can carry a lone surrogate (it is not a character): the call is reported, the
    text kept. A high escape followed by a low one is the character they name."""
    name, tok, parser = fmt

    @PROPERTY
    @given(head=strings, first=surrogates, second=surrogates, paired=st.booleans())
    def one(head: str, first: int, second: int, paired: bool) -> None:
        if paired:
            first, second = 0xD800 | first & 0x3FF, 0xDC00 | second & 0x3FF
            escape = f"\\u{first:04x}\\u{second:04X}"
        else:
            escape = f"\\u{first:04x}"
        text = escape.join(
            write_call(tok, name, {"path": "a", "content": head + "@"}).rsplit("@", 1)
        )
        reply = parse(tok, parser, sampled_ids(tok, name, text))
        if paired:
            char = chr(0x10000 + ((first & 0x3FF) << 10) + (second & 0x3FF))
            got = [(c.function.name, json.loads(c.function.arguments)) for c in reply.tool_calls]
            assert got == [(TOOL, {"path": "a", "content": head + char})], (name, reply)
        else:
            assert reply.tool_calls == (), (name, escape, reply)
            assert f"lone surrogate escape {escape}" in (reply.tool_call_error or ""), reply
            assert text.endswith(reply.content), (name, reply)

    one()


def test_gyre_format_keeps_the_exact_text_of_a_compact_call():
    """gyre's format keeps the model's own argument text when the call is written as the
    template writes it; any other spacing is re-serialised, the same JSON value (B23)."""
    parser = format_parser("gyre", build_tokenizer())
    compact = '<tool_call>{"name":"write_file","arguments":{"a":"</tool_call>"}}</tool_call>'
    (call,) = parser.parse(compact, "c", tools=TOOLS).tool_calls
    assert call.function.arguments == '{"a": "</tool_call>"}'
    canonical = '<tool_call>{"name": "write_file", "arguments": {"a":"x" }}</tool_call>'
    (call,) = parser.parse(canonical, "c", tools=TOOLS).tool_calls
    assert call.function.arguments == '{"a":"x" }'


@pytest.mark.parametrize(
    "text, shielded",
    [
        ('{"a": "x\\\\<tool_call>"}', '{"a": "x\\\\\\u003ctool_call>"}'),  # after an escaped \
        ('{"a": "\\u003c<tool_call>"}', '{"a": "\\u003c\\u003ctool_call>"}'),
        ('{"a": "</tool_call>"} <tool_call>', '{"a": "\\u003c/tool_call>"} <tool_call>'),
        ('{"a": 1} "<tool_call>"', '{"a": 1} "<tool_call>"'),  # a string outside JSON: prose
        ('{"a": "<tool_call>" <tool_call>', '{"a": "<tool_call>" <tool_call>'),  # not JSON
    ],
)
def test_shield_escapes_markers_only_inside_json_strings(text, shielded):
    s = shield(text, ["<tool_call>", "</tool_call>"])
    assert s.text == shielded and s.restore(s.text) == text
    if s.text != text:
        assert json.loads(s.text[: s.text.index("}") + 1]) == json.loads(
            text[: text.index("}") + 1]
        )
