"""Reply fuzz: whatever token IDs the model samples, every route answers well (issue 45).

Random completions from the scripted engine (any ID of the tiny vocabulary, control tokens, byte
tokens that form no UTF-8, and pieces of tool calls: tags, lone and paired surrogate escapes,
NaN, numbers beyond a double, deep nesting) through Chat Completions, Completions, Responses
and Messages, plain and streamed, with and without tools: never a 5xx; every body is UTF-8
JSON, every stream well-formed server-sent events ending with the route's final event
(`tests/tito/answers.py` reads them strictly); the answer carries the sampled IDs; and the call
log holds each call exactly once, with those IDs. Derandomized, so the same replies run every
time. The request side is fuzzed in `test_fuzz.py`.
"""

from __future__ import annotations

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from gyre.tito.log import read_log
from tests.tito.answers import CHAT_ROUTES, Answer, ask
from tests.tito.conftest import encode, make_proxy
from tests.tito.families import FAMILIES, family_tokenizer
from tests.tito.written import byte_ids, write_call

FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

SNIPPETS = [
    "<tool_call>",
    "</tool_call>",
    '<tool_call>{"name": "write_file", "arguments": {"path": "a", "content": "',
    '<tool_call>{"name":"write_file","arguments":{"content":"',
    '"}}</tool_call>',
    '<tool_call>{"name": "write_file", "arguments": {"path": "a"}}</tool_call>',
    '"}}',
    "\\ud83d",
    "\\ud83d\\ude00",
    "\\udc00",
    "NaN",
    "1e400",
    "-Infinity",
    "123456789012345678901234567890",
    "[" * 40,
    "]" * 40,
    '{"a": ' * 30,
    '"',
    "\\",
    "\\u00",
    "<think>",
    "</think>",
    "\n",
    "{",
    "}",
    "smile 😀 文件",
]
IN_STRING = [
    "\\ud83d",
    "\\udc00 ",
    "\\ud83d\\ude00",
    "\\ud83d\\u0041",
    '\\"',
    "\\\\",
    "\\n",
    "</tool_call>",
    "<|im_end|>",
    "smile 😀 文件",
    "plain words",
]
ROUTES = [
    (route, stream, tools)
    for route in CHAT_ROUTES
    for stream in (False, True)
    for tools in ((), ("write_file",))
] + [("completions", stream, ()) for stream in (False, True)]


CALLS = [  # (head, tail) of a tool call whose last argument is a string
    (
        '<tool_call>{"name": "write_file", "arguments": {"path": "a", "content": "',
        '"}}</tool_call>',
    ),
    ('<tool_call>{"name":"write_file","arguments":{"content":"', '"}}</tool_call>\n'),
    ('<tool_call>\n{"name": "write_file", "arguments": {"lines": ["', '"]}}\n</tool_call>'),
]


def strategy(tok, calls_in: list[tuple[str, str]]) -> st.SearchStrategy[list[int]]:
    """Completions: noise (any ID, control tokens, non-ASCII byte tokens, pieces of tool-call
    text), then tool calls whose string argument is such noise, then noise again."""
    vocab = len(tok)
    specials = sorted(tok.get_added_vocab().values())
    high_bytes = byte_ids(tok, bytes(range(0x80, 0x100)))
    piece = (
        st.lists(st.integers(0, vocab - 1), min_size=1, max_size=4)
        | st.lists(st.sampled_from(specials), min_size=1, max_size=2)
        | st.lists(st.sampled_from(high_bytes), min_size=1, max_size=3)
        | st.sampled_from([encode(tok, s) for s in SNIPPETS])
    )
    noise = st.lists(piece, max_size=8).map(lambda ps: [t for p in ps for t in p])
    in_string = (  # what a JSON string may hold, so that many calls are well-formed
        st.lists(st.sampled_from(specials), min_size=1, max_size=2)
        | st.lists(st.sampled_from(high_bytes), min_size=1, max_size=3)
        | st.sampled_from([encode(tok, s) for s in IN_STRING])
    )
    call = st.builds(
        lambda ends, inside: (
            encode(tok, ends[0]) + [t for p in inside for t in p] + encode(tok, ends[1])
        ),
        st.sampled_from(calls_in),
        st.lists(in_string, max_size=6),
    )
    calls = st.lists(call, max_size=2).map(lambda cs: [t for c in cs for t in c])
    return st.builds(lambda a, b, c: a + b + c, noise | st.just([]), calls, noise | st.just([]))


def expected_ids(ids: list[int], stops: set[int], max_tokens: int) -> list[int]:
    """What the engine samples of `ids`: up to and including the first stop ID, at most
    `max_tokens`."""
    for i, t in enumerate(ids):
        if t in stops:
            ids = ids[: i + 1]
            break
    return ids[:max_tokens]


def check(a: Answer, want: list[int]) -> None:
    assert a.status == 200 and a.error is None, a
    assert a.token_ids == want, (a.token_ids, want)
    assert a.finish in ("stop", "length", "tool_calls"), a
    assert (a.finish == "tool_calls") == bool(a.calls), a
    for name, args in a.calls:
        assert isinstance(name, str) and isinstance(args, dict), a


def fuzz(engine, proxy, log, ids: st.SearchStrategy[list[int]], stops: set[int], examples: int):
    """Every route, plain and streamed, with and without tools, for each completion `ids` draws
    (`stops`: the IDs that end a reply); then the call log holds each call once, with the IDs
    the answer carried."""
    executions: dict[str, list[int]] = {}

    async def run(ids: list[int], max_tokens: int) -> None:
        want = expected_ids(ids, stops, max_tokens)
        for route, stream, tools in ROUTES:
            engine.push(ScriptedReply(token_ids=ids))
            execution = f"x{len(executions)}"
            key = proxy.mint_key(execution)
            a = await ask(proxy, key, route, stream=stream, tools=tools, max_tokens=max_tokens)
            check(a, want)
            (call,) = proxy.calls(execution)  # recorded once
            assert call.completion_ids == want, (route, stream, tools)
            executions[execution] = want
            await proxy.close(execution)

    @settings(FUZZ, max_examples=examples)
    @given(ids=ids, max_tokens=st.sampled_from([1000, 1000, 1000, 7]))
    def one(ids: list[int], max_tokens: int) -> None:
        anyio.run(run, ids, max_tokens)

    one()
    contents = read_log(log)
    assert contents.torn_bytes == 0 and contents.unresolved == 0
    logged: dict[str, list[list[int]]] = {}
    for c in contents.calls:
        logged.setdefault(c.execution_id, []).append(c.completion_ids)
    assert logged == {x: [ids] for x, ids in executions.items()}  # each call once, exactly
    assert set(contents.summaries) == set(executions)
    assert proxy.statistics().in_flight == 0


def test_any_sampled_reply_is_answered_on_every_route(tok, tmp_path):
    """gyre's own format (the tiny model)."""
    log = tmp_path / "calls.log"
    engine = ScriptedEngine(eos_token_id=tok.eos_token_id)
    proxy = make_proxy(tok, engine, log_path=log)
    # The tiny model ends on EOS alone (no generation_config.json).
    fuzz(engine, proxy, log, strategy(tok, CALLS), {tok.eos_token_id}, examples=80)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_any_sampled_reply_in_a_vllm_parsed_format(name, tmp_path):
    """Each family of `tests/tito/families.py` through vLLM's parsers: calls written as the
    family's template writes them, with noise around and inside."""
    tok = family_tokenizer(name, tmp_path / name)
    fam = FAMILIES[name]
    log = tmp_path / "calls.log"
    engine = ScriptedEngine(eos_token_id=tok.eos_token_id, vocab_size=len(tok))
    proxy = make_proxy(
        tok,
        engine,
        log_path=log,
        tool_parser=fam.tool_parser,
        reasoning_parser=fam.reasoning_parser,
    )
    head, tail = write_call(tok, name, {"content": "@"}).rsplit("@", 1)
    stops = {tok.eos_token_id, *tok.convert_tokens_to_ids(list(fam.end_tokens))}
    fuzz(engine, proxy, log, strategy(tok, [(head, tail)]), stops, examples=10)
