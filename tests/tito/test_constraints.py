"""Constraints are enforced or refused, never dropped (issue #17 item 5): tool_choice,
parallel_tool_calls, response_format, logit_bias, penalties, top_logprobs, echo, suffix, best_of,
and invalid histories. The scripted engine enforces grammars with xgrammar's matcher over the
tiny model's tokenizer, so a reply the grammar forbids cannot pass."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import msgspec
import pytest
import xgrammar as xgr

from gyre.cell.wire import Frame, FrameBatch, StreamedGenerate, decode, encode
from gyre.engines.protocol import GenerateRequest, SamplingParams, StructuredOutput, TokenDelta
from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from gyre.engines.vllm_params import sampled_logprobs, top_entries
from gyre.errors import EngineError, ProxyError
from gyre.tito.constraints import chat_constraint
from gyre.tito.wire import CHAT_DECODER
from tests.tito.conftest import asgi_post, make_proxy
from tests.tito.conftest import encode as enc

pytestmark = pytest.mark.anyio

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}},
                "required": ["a"],
            },
        },
    },
    {"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}},
]
USER = [{"role": "user", "content": "go"}]
ADD = '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
LS = '<tool_call>{"name": "ls", "arguments": {}}</tool_call>'


def chat_req(**kw):
    return CHAT_DECODER.decode(json.dumps({"model": "gyre", "messages": USER, **kw}).encode())


def accepts(tok, spec: StructuredOutput, text: str) -> bool:
    """Whether xgrammar's matcher takes `text` + EOS to the grammar's end (the same check vLLM's
    xgrammar backend masks with)."""
    info = xgr.TokenizerInfo.from_huggingface(tok, stop_token_ids=[tok.eos_token_id])
    compiler = xgr.GrammarCompiler(info)
    if spec.kind == "json_schema":  # as vLLM's xgrammar backend with disable_any_whitespace
        compiled = compiler.compile_json_schema(
            spec.spec, any_whitespace=False, separators=(",", ":")
        )
    else:
        compiled = compiler.compile_structural_tag(spec.spec)
    m = xgr.GrammarMatcher(compiled)
    ids = enc(tok, text) + [tok.eos_token_id]
    return all(m.accept_token(t) for t in ids) and m.is_terminated()


# -- the grammar itself -----------------------------------------------------------------------


def test_required_tool_choice_accepts_only_calls_of_offered_tools(tok):
    c = chat_constraint(chat_req(tools=TOOLS, tool_choice="required"))
    assert c is not None and c.kind == "structural_tag"
    assert accepts(tok, c, ADD)
    assert accepts(tok, c, LS + ADD)  # parallel calls
    assert not accepts(tok, c, f"<think>hm</think>\n{LS}")  # a forced call starts at once
    assert not accepts(tok, c, "no call")
    assert not accepts(tok, c, '<tool_call>{"name": "rm", "arguments": {}}</tool_call>')
    assert not accepts(tok, c, '<tool_call>{"name": "add", "arguments": {"a": "x"}}</tool_call>')


def test_named_choice_and_parallel_false_allow_exactly_one_call(tok):
    named = chat_constraint(
        chat_req(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "ls"}})
    )
    assert accepts(tok, named, LS)
    assert not accepts(tok, named, ADD)
    assert not accepts(tok, named, LS + LS)
    single = chat_constraint(
        chat_req(tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    )
    assert accepts(tok, single, ADD) and not accepts(tok, single, ADD + LS)
    auto_single = chat_constraint(chat_req(tools=TOOLS, parallel_tool_calls=False))
    assert accepts(tok, auto_single, "plain text")
    assert accepts(tok, auto_single, "ok " + LS)
    assert accepts(tok, auto_single, f"<think>hm</think>\n{LS}")
    assert not accepts(tok, auto_single, LS + LS)


def test_response_format_json_schema_and_json_object(tok):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    c = chat_constraint(
        chat_req(response_format={"type": "json_schema", "json_schema": {"schema": schema}})
    )
    assert c.kind == "json_schema"
    assert accepts(tok, c, '{"n":3}')
    assert not accepts(tok, c, '{"n": 3}')  # compact: no whitespace run for a policy to fill
    assert not accepts(tok, c, '{"n":"three"}') and not accepts(tok, c, "sure")
    obj = chat_constraint(chat_req(response_format={"type": "json_object"}))
    assert accepts(tok, obj, '{"x":[1]}') and not accepts(tok, obj, "[1]")
    assert chat_constraint(chat_req(response_format={"type": "text"})) is None
    assert chat_constraint(chat_req(tools=TOOLS)) is None  # auto, parallel: nothing to enforce


# -- through the proxy ------------------------------------------------------------------------


def setup(tok, *replies: str, **config):
    engine = ScriptedEngine(
        [ScriptedReply(token_ids=enc(tok, r) + [tok.eos_token_id]) for r in replies],
        eos_token_id=tok.eos_token_id,
        tokenizer=tok,
        vocab_size=len(tok),
    )
    proxy = make_proxy(tok, engine, **config)
    return engine, proxy, proxy.mint_key("ex")


async def post(proxy, key, path=CHAT, **body):
    body.setdefault("model", "gyre")
    if path == CHAT:
        body.setdefault("messages", USER)
    status, raw = await asgi_post(proxy, path, key, body)
    return status, json.loads(raw)


async def test_required_tool_call_is_enforced_end_to_end(tok, anyio_backend):
    engine, proxy, key = setup(tok, ADD, "I will not call a tool")
    status, body = await post(proxy, key, tools=TOOLS, tool_choice="required", max_tokens=64)
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "add"
    sent = engine.requests_seen[-1].sampling.structured
    assert sent is not None and sent.kind == "structural_tag"
    assert '"at_least_one": true' in sent.spec
    # a reply the grammar forbids cannot be sampled: the scripted engine fails it loudly
    status, body = await post(proxy, key, tools=TOOLS, tool_choice="required", max_tokens=64)
    assert status >= 500 and "grammar forbids" in body["error"]["message"]


async def test_response_format_json_schema_end_to_end(tok, anyio_backend):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    engine, proxy, key = setup(tok, '{"n":7}')
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    status, body = await post(proxy, key, response_format=fmt, max_tokens=32)
    assert status == 200, body
    assert json.loads(body["choices"][0]["message"]["content"]) == {"n": 7}
    sent = engine.requests_seen[-1].sampling.structured
    assert sent.kind == "json_schema" and json.loads(sent.spec) == schema


@pytest.mark.parametrize(
    "extra, param",
    [
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "rm"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
        ),
        (
            {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
            "response_format",
        ),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"99999": 1}}, "logit_bias"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
    ],
)
async def test_chat_parameters_it_cannot_honour_get_400(tok, anyio_backend, extra, param):
    engine, proxy, key = setup(tok)
    status, body = await post(proxy, key, **extra)
    assert status == 400, body
    assert body["error"]["param"] == param, body
    assert engine.requests_seen == []  # nothing ran, nothing recorded


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"suffix": "end"}, "suffix"),
        ({"best_of": 2}, "best_of"),
        ({"echo": True, "logprobs": 1}, "echo"),
        ({"logprobs": 21}, "logprobs"),
    ],
)
async def test_completion_parameters_it_cannot_honour_get_400(tok, anyio_backend, extra, param):
    engine, proxy, key = setup(tok)
    status, body = await post(proxy, key, COMPLETIONS, prompt="abc", **extra)
    assert status == 400, body
    assert body["error"]["param"] == param
    assert engine.requests_seen == []


async def test_bias_and_penalties_reach_the_engine_and_the_record(tok, anyio_backend):
    engine, proxy, key = setup(tok, "hello")
    status, body = await post(
        proxy,
        key,
        logit_bias={"7": -100, "9": 2.5},
        presence_penalty=0.5,
        frequency_penalty=-0.25,
        repetition_penalty=1.1,
    )
    assert status == 200, body
    s = engine.requests_seen[-1].sampling
    assert (s.logit_bias, s.presence_penalty, s.frequency_penalty, s.repetition_penalty) == (
        {7: -100.0, 9: 2.5},
        0.5,
        -0.25,
        1.1,
    )
    # the sampling block is what the ModelCall record stores: the fields survive its encoding
    rec = msgspec.json.decode(msgspec.json.encode(s), type=SamplingParams)
    assert rec.logit_bias == {7: -100.0, 9: 2.5} and rec.repetition_penalty == 1.1


async def test_a_banned_token_is_never_emitted(tok, anyio_backend):
    banned = enc(tok, "hello")[0]
    engine, proxy, key = setup(tok, "hello")
    status, body = await post(proxy, key, logit_bias={str(banned): -100})
    assert status >= 500 and "logit_bias bans it" in body["error"]["message"]


async def test_top_logprobs_returns_k_entries_led_by_the_sampled_token(tok, anyio_backend):
    engine, proxy, key = setup(tok, "hello world")
    status, body = await post(proxy, key, logprobs=True, top_logprobs=3)
    assert status == 200, body
    assert engine.requests_seen[-1].sampling.top_logprobs == 3
    content = body["choices"][0]["logprobs"]["content"]
    ids = body["choices"][0]["token_ids"]
    assert len(content) == len(ids) > 1
    for i, entry in enumerate(content):
        assert len(entry["top_logprobs"]) == 3
        top = entry["top_logprobs"][0]
        assert top["logprob"] == entry["logprob"] == pytest.approx(-0.5 - 0.01 * i)
        assert (top["token"], top["bytes"]) == (entry["token"], entry["bytes"])  # sampled
        # the scripted engine's j-th entry is (token + j) mod vocab with logprob lp - j
        assert [e["logprob"] for e in entry["top_logprobs"]] == pytest.approx(
            [entry["logprob"] - j for j in range(3)]
        )
    # k = 0 keeps the wire lean: no top entries
    engine.push(ScriptedReply(token_ids=enc(tok, "hi") + [tok.eos_token_id]))
    status, body = await post(proxy, key, logprobs=True)
    assert all(e["top_logprobs"] == [] for e in body["choices"][0]["logprobs"]["content"])
    assert engine.requests_seen[-1].sampling.top_logprobs == 0


async def test_completions_logprobs_k_and_echo(tok, anyio_backend):
    engine, proxy, key = setup(tok, " there", " there")
    status, body = await post(proxy, key, COMPLETIONS, prompt="hi", logprobs=2, max_tokens=8)
    assert status == 200, body
    tops = body["choices"][0]["logprobs"]["top_logprobs"]
    assert len(tops) == len(body["choices"][0]["token_ids"])
    assert all(len(t) == 2 for t in tops)
    status, body = await post(proxy, key, COMPLETIONS, prompt="hi", echo=True, max_tokens=8)
    assert status == 200, body
    text = body["choices"][0]["text"]
    assert text.startswith("hi") and text == "hi" + " there"


# -- histories ----------------------------------------------------------------------------------


CALLED = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}],
}


@pytest.mark.parametrize(
    "messages, param",
    [
        (
            [*USER, CALLED, {"role": "tool", "tool_call_id": "c9", "content": "x"}],
            "messages[2].tool_call_id",
        ),
        (
            [*USER, {"role": "tool", "tool_call_id": "c1", "content": "x"}],
            "messages[1].tool_call_id",
        ),
        ([*USER, CALLED, {"role": "tool", "content": "x"}], "messages[2].tool_call_id"),
        ([{"role": "wizard", "content": "x"}], "messages[0].role"),
    ],
)
async def test_invalid_histories_get_400(tok, anyio_backend, messages, param):
    engine, proxy, key = setup(tok)
    status, body = await post(proxy, key, messages=messages, tools=TOOLS)
    assert status == 400, body
    assert body["error"]["param"] == param
    assert engine.requests_seen == []


async def test_a_tool_message_answering_an_earlier_call_is_accepted(tok, anyio_backend):
    engine, proxy, key = setup(tok, "done")
    messages = [*USER, CALLED, {"role": "tool", "tool_call_id": "c1", "content": "a b"}]
    status, body = await post(proxy, key, messages=messages, tools=TOOLS)
    assert status == 200, body


# -- the engine seam and the cell wire ----------------------------------------------------------


async def test_scripted_engine_refuses_a_grammar_without_a_tokenizer(anyio_backend):
    from gyre.engines.protocol import collect
    from gyre.errors import InvalidRequestError

    engine = ScriptedEngine()
    req = GenerateRequest(
        request_id="r",
        prompt_ids=[5],
        sampling=SamplingParams(structured=StructuredOutput(kind="regex", spec="a+")),
    )
    with pytest.raises(InvalidRequestError, match="tokenizer"):
        await collect(engine, req)


def test_new_fields_cross_the_cell_wire():
    s = SamplingParams(
        top_logprobs=3,
        logit_bias={4: -1.5},
        presence_penalty=0.5,
        frequency_penalty=0.25,
        repetition_penalty=1.2,
        structured=StructuredOutput(kind="json_schema", spec='{"type": "object"}'),
    )
    req = StreamedGenerate(
        stream="s", tag=1, request=GenerateRequest(request_id="r", prompt_ids=[1], sampling=s)
    )
    assert decode(encode(req), StreamedGenerate) == req
    delta = TokenDelta(
        index=0,
        token_ids=[5],
        logprobs=[-0.1],
        versions=[0],
        top_ids=[[5, 6, 7]],
        top_logprobs=[[-0.1, -2.0, -3.0]],
    )
    batch = FrameBatch([Frame(delta=delta, tag=1)])
    assert decode(encode(batch), FrameBatch) == batch
    plain = TokenDelta(index=0, token_ids=[5], logprobs=[-0.1], versions=[0])
    with_top = TokenDelta(
        index=0, token_ids=[5], logprobs=[-0.1], versions=[0], top_ids=[[5]], top_logprobs=[[-0.1]]
    )
    assert len(encode(plain)) < len(encode(with_top))


def test_vllm_top_k_is_ranked_and_drops_masked_tokens():
    lp = lambda v, r: SimpleNamespace(logprob=v, rank=r)  # noqa: E731 (vLLM's Logprob shape)
    positions = [
        {9: lp(-3.0, 5), 1: lp(-0.2, 1), 2: lp(-1.9, 2), 3: lp(-2.5, 3)},  # sampled 9, rank 5
        {4: lp(-0.0, 1), 5: lp(-math.inf, 2), 6: lp(-math.inf, 3)},  # the grammar masked 5, 6
    ]
    ids, lps = top_entries(positions, 2, 3)
    assert ids == [[1, 2, 3], [4]]
    assert lps == [[-0.2, -1.9, -2.5], [-0.0]]


def test_vllm_flat_logprobs_give_the_sampled_tokens_logprob_and_the_top_k():
    """gyre asks vLLM for flat logprobs (`sampling_params`: flat lists instead of a dict and a
    `Logprob` per token). Built here by vLLM's own code from two steps as its sampler reports
    them: the sampled token first with its rank, then the top k (k=2)."""
    vllm_logprobs = pytest.importorskip("vllm.logprobs")
    flat = vllm_logprobs.FlatLogprobs()
    step = vllm_logprobs.append_logprobs_for_next_position
    step(flat, [9, 1, 2], [-3.0, -0.2, -1.9], [None] * 3, 5, 2)  # sampled 9, rank 5
    step(flat, [4, 4, 7], [-0.1, -0.1, -2.4], [None] * 3, 1, 2)  # sampled 4, the top token
    assert sampled_logprobs(flat, [9, 4]) == [-3.0, -0.1]
    assert sampled_logprobs(flat[1:], [4]) == [-0.1]  # a delta's positions: vLLM slices them
    assert top_entries(flat, 2, 2) == ([[1, 2], [4, 7]], [[-0.2, -1.9], [-0.1, -2.4]])
    with pytest.raises(EngineError, match="do not match the sampled tokens"):
        sampled_logprobs(flat, [9, 5])
    with pytest.raises(EngineError, match="2 positions for 1 tokens"):
        sampled_logprobs(flat, [9])


def strict_tools() -> list[dict]:
    return [{**t, "function": {**t["function"], "strict": True}} for t in TOOLS]


def test_a_strict_tool_under_auto_constrains_calls_and_leaves_text_free(tok):
    """`strict: true` (the OpenAI Agents SDK sets it on every tool) was accepted and ignored: a
    call's arguments could break the schema."""
    c = chat_constraint(chat_req(tools=strict_tools()))
    assert c is not None and c.kind == "structural_tag"
    assert accepts(tok, c, "plain text")
    assert accepts(tok, c, f"<think>hm</think>\nok {ADD}")
    assert accepts(tok, c, ADD + LS + " done")  # parallel calls, text after a call (B27)
    assert not accepts(tok, c, '<tool_call>{"name": "add", "arguments": {"a": "x"}}</tool_call>')
    assert not accepts(tok, c, '<tool_call>{"name": "rm", "arguments": {}}</tool_call>')
    lax = [{**t, "function": {**t["function"], "strict": False}} for t in TOOLS]
    assert chat_constraint(chat_req(tools=lax)) is None
    with pytest.raises(ProxyError, match=r"tools\[0\].function.strict='yes' must be a boolean"):
        chat_constraint(chat_req(tools=[{**TOOLS[0], "function": {"name": "a", "strict": "yes"}}]))
    # a vLLM-parsed format has no call grammar yet: served, not enforced (documented)
    assert chat_constraint(chat_req(tools=strict_tools()), None) is None


async def test_a_strict_tool_is_enforced_through_the_responses_api(tok, anyio_backend):
    bad = '<tool_call>{"name": "add", "arguments": {"a": "x"}}</tool_call>'
    engine, proxy, key = setup(tok, ADD, bad)
    tools = [{"type": "function", **t["function"]} for t in strict_tools()]
    status, body = await post(proxy, key, "/v1/responses", input="go", tools=tools)
    assert status == 200, body
    assert json.loads(body["output"][-1]["arguments"]) == {"a": 1}
    assert engine.requests_seen[-1].sampling.structured.kind == "structural_tag"
    status, body = await post(proxy, key, "/v1/responses", input="go", tools=tools)
    assert status >= 500 and "grammar forbids" in body["error"]["message"]
