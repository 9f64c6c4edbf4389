"""Reply parsing: reasoning, content and tool calls; streamed prefixes never taken back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gyre.tito.reply import ReplyStream, parse_reply, partial_reply
from gyre.tito.wire import FunctionCall, ToolCall


@given(st.text(alphabet=st.sampled_from(list('ab<>/think_col\n{}"')), max_size=60))
def test_partial_reply_only_grows_into_the_final_parse(s):
    final = parse_reply(s)
    for i in range(len(s) + 1):
        r, c = partial_reply(s[:i])
        assert (final.reasoning or "").startswith(r)
        assert (final.content or "").startswith(c)


def test_parse_reply_cases():
    p = parse_reply(
        '<think>plan</think>\nok<tool_call>{"name": "run", "arguments": {"cmd": "ls  -a"}}'
        "</tool_call>",
        "x",
    )
    assert (p.reasoning, p.content, p.tool_call_error) == ("plan", "ok", None)
    assert p.tool_calls == (
        ToolCall(id="x_0", function=FunctionCall(name="run", arguments='{"cmd": "ls  -a"}')),
    )
    bad = parse_reply('<tool_call>{"name": "run", "arguments": {"cmd": "ls"}</tool_call>')
    assert (
        bad.tool_calls == ()
        and bad.content.startswith("<tool_call>")
        and "malformed" in bad.tool_call_error
    )
    trailing = parse_reply('<tool_call>{"name": "run", "arguments": {}}</tool_call> and more')
    assert trailing.tool_calls == (
        ToolCall(id="call_0", function=FunctionCall(name="run", arguments="{}")),
    )
    assert (trailing.content, trailing.tool_call_error) == (" and more", None)  # B27 (d)
    two = parse_reply(
        'a<tool_call>{"name": "f", "arguments": {"n": 1}}</tool_call>\n '
        '<tool_call>{"name": "g", "arguments": {}}</tool_call>\n'
    )
    assert [(c.function.name, c.function.arguments) for c in two.tool_calls] == [
        ("f", '{"n": 1}'),
        ("g", "{}"),
    ]
    assert two.content == "a"  # whitespace between and after calls is not content
    compact = parse_reply('<tool_call>{"name":"run","arguments":{"n":1}}</tool_call>')
    assert compact.tool_calls[0].function.arguments == '{"n": 1}'  # non-canonical: re-serialised
    assert parse_reply("<think>unfinished").reasoning == "unfinished"
    assert parse_reply("<tool_call>x", tools=False).content == "<tool_call>x"


@given(
    st.text(alphabet=st.sampled_from(list('ab<>/think_col\n{}"')), max_size=60),
    st.lists(st.integers(1, 7), max_size=30),
    st.booleans(),
)
def test_reply_stream_emits_only_prefixes_of_the_final_parse(s, cuts, tools):
    stream, reasoning, content, pos = ReplyStream(tools=tools), "", "", 0
    for n in cuts + [len(s)]:
        r, c = stream.feed(s[pos : pos + n])
        reasoning, content, pos = reasoning + r, content + c, pos + n
    final = parse_reply(s, tools=tools)
    assert (final.reasoning or "").startswith(reasoning)
    assert (final.content or "").startswith(content)
    if not tools and not s.startswith("<think>") and not "<think>".startswith(s):
        assert content == s  # plain text streams whole
