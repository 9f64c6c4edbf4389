"""Field case B36 (docs/field_cases.md): a SentencePiece tokenizer's replies keep their spaces
and show byte-fallback pieces as the bytes they stand for, on every route; and a conversation
through a SentencePiece tokenizer keeps one path where its template re-renders the reply, and
branches where the tokenizer or template add text the model did not sample.

Tokenizers in the Llama 2 / Mistral / Phi-3 (`llama2`: legacy Prepend normalizer; `metaspace`:
the Metaspace pre-tokenizer, with Mistral's pre-v11 template) and Gemma layouts, trained locally
(`tests/tito/sp_families.py`); the reference is the tokenizer's own `decode` of the sampled IDs.
"""

from __future__ import annotations

import json

import pytest

from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from tests.tito.conftest import asgi_post, make_proxy
from tests.tito.sp_families import MISTRAL_V3_CONTROLS, MISTRAL_V3_TEMPLATE, sp_tokenizer

pytestmark = pytest.mark.anyio

LLAMA2_TEMPLATE = """{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}
{{- '[INST] ' + m.content | trim + ' [/INST]' }}{% elif m.role == 'assistant' %}
{{- ' ' + m.content | trim + ' ' + eos_token }}{% endif %}{% endfor %}"""
"""Llama 2's chat format (system prompt left out): a space before the EOS it re-renders."""

SPACED_TEMPLATE = LLAMA2_TEMPLATE.replace("' ' + eos_token", "eos_token")
"""Llama 2's format without that space: the reply re-renders as the model samples it."""

GEMMA_TEMPLATE = """{{ bos_token }}{% for m in messages %}<start_of_turn>
{{- 'model' if m.role == 'assistant' else m.role }}
{{ m.content | trim }}<end_of_turn>
{% endfor %}{% if add_generation_prompt %}<start_of_turn>model
{% endif %}"""

LAYOUTS = {
    "llama2": ((), LLAMA2_TEMPLATE, ()),
    "metaspace": (MISTRAL_V3_CONTROLS, MISTRAL_V3_TEMPLATE, ()),
    "gemma": (("<start_of_turn>", "<end_of_turn>"), GEMMA_TEMPLATE, ("<end_of_turn>",)),
}
REPLIES = ("Sure, I will run ls -la now.", "line one\nline two", "读 🎉 ok")


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def family(request, tmp_path_factory):
    controls, template, ends = LAYOUTS[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    tok = sp_tokenizer(request.param, folder, controls=controls, template=template, ends=ends)
    return request.param, tok


def sse_data(raw: bytes) -> list[dict]:
    lines = raw.decode().splitlines()
    return [json.loads(x[6:]) for x in lines if x.startswith("data: ") and x != "data: [DONE]"]


async def ask(proxy, execution: str, route: str, stream: bool) -> tuple[str, list[int]]:
    """(reply text as the client assembles it, completion IDs as recorded) of one request."""
    key = proxy.mint_key(execution)
    msgs = [{"role": "user", "content": "Run ls."}]
    if route == "chat":
        body = {"model": "gyre", "messages": msgs, "stream": stream}
        status, raw = await asgi_post(proxy, "/v1/chat/completions", key, body)
        assert status == 200, raw
        if stream:
            chunks = sse_data(raw)
            got = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
        else:
            got = json.loads(raw)["choices"][0]["message"]["content"]
    elif route == "messages":
        body = {"model": "gyre", "messages": msgs, "max_tokens": 64, "stream": stream}
        status, raw = await asgi_post(proxy, "/v1/messages", key, body)
        assert status == 200, raw
        if stream:
            deltas = [e["delta"] for e in sse_data(raw) if e["type"] == "content_block_delta"]
            got = "".join(d.get("text", "") for d in deltas)
        else:
            got = "".join(b["text"] for b in json.loads(raw)["content"] if b["type"] == "text")
    else:
        status, raw = await asgi_post(
            proxy, "/v1/responses", key, {"model": "gyre", "input": "Run ls."}
        )
        assert status == 200, raw
        out = json.loads(raw)["output"]
        got = "".join(
            p["text"] for item in out if item["type"] == "message" for p in item["content"]
        )
    return got, proxy.calls(execution, full=True)[-1].completion_ids


@pytest.mark.parametrize(
    "route,stream",
    [
        ("chat", False),
        ("chat", True),
        ("messages", False),
        ("messages", True),
        ("responses", False),
    ],
)
async def test_b36_sentencepiece_replies_are_the_tokenizers_decode(
    family, route, stream, anyio_backend
):
    name, tok = family
    eos = tok.convert_tokens_to_ids("<end_of_turn>") if name == "gemma" else tok.eos_token_id
    replies = [tok.encode(r, add_special_tokens=False) + [eos] for r in REPLIES]
    engine = ScriptedEngine([ScriptedReply(token_ids=r) for r in replies], vocab_size=len(tok))
    parser = "mistral" if name == "metaspace" else "gyre"  # Mistral's template takes its IDs
    proxy = make_proxy(tok, engine, tool_parser=parser, reasoning_parser="none")
    for i, text in enumerate(REPLIES):
        got, ids = await ask(proxy, f"{route}-{stream}-{i}", route, stream)
        assert ids == replies[i]
        want = tok.decode(ids[:-1], skip_special_tokens=False)
        assert got == want == text


async def two_turns(tok, template: str, reply: list[int], eos: int, **config):
    """Two chat turns answered with `reply` (+ EOS), the first echoed back; the calls."""
    tok.chat_template = template
    engine = ScriptedEngine([ScriptedReply(token_ids=reply + [eos])] * 2, vocab_size=len(tok))
    proxy = make_proxy(tok, engine, **config)
    key = proxy.mint_key("x")
    msgs = [{"role": "user", "content": "Run ls."}]
    for _ in range(2):
        body = {"model": "gyre", "messages": msgs}
        status, raw = await asgi_post(proxy, "/v1/chat/completions", key, body)
        assert status == 200, raw
        content = json.loads(raw)["choices"][0]["message"]["content"]
        assert content == tok.decode(reply, skip_special_tokens=False)
        msgs += [{"role": "assistant", "content": content}, {"role": "user", "content": "Next."}]
    return proxy.calls("x", full=True)


def one_path(calls) -> bool:
    a, b = calls
    known = a.prompt_ids + a.completion_ids
    return b.divergence is None and b.prompt_ids[: len(known)] == known


async def test_b36_a_sentencepiece_conversation_keeps_one_path(tmp_path, anyio_backend):
    # Mistral v0.3 (Metaspace): the template writes " " + reply + EOS, the model's "▁Sure".
    tok = sp_tokenizer("metaspace", tmp_path / "m", controls=MISTRAL_V3_CONTROLS)
    reply = tok.encode(REPLIES[0], add_special_tokens=False)
    mistral = {"tool_parser": "mistral", "reasoning_parser": "none"}
    assert one_path(await two_turns(tok, MISTRAL_V3_TEMPLATE, reply, tok.eos_token_id, **mistral))
    # Llama 2's tokenizer adds "▁" after every control token; a reply sampled in pieces the
    # tokenizer would not choose ("▁", "w", "i", "l", "l" for "▁will") is kept as sampled.
    tok = sp_tokenizer("llama2", tmp_path / "l")
    will = tok.convert_tokens_to_ids(["▁will"])
    pieces = tok.convert_tokens_to_ids(["▁"] + [f"<0x{ord(c):02X}>" for c in "will"])
    reply = tok.encode(REPLIES[0], add_special_tokens=False)
    at = reply.index(will[0])
    reply = reply[:at] + pieces + reply[at + 1 :]
    assert one_path(await two_turns(tok, SPACED_TEMPLATE, reply, tok.eos_token_id))


async def test_b36_llama2s_space_before_eos_branches_there(tmp_path, anyio_backend):
    tok = sp_tokenizer("llama2", tmp_path / "l")
    reply = tok.encode(REPLIES[0], add_special_tokens=False)
    a, b = await two_turns(tok, LLAMA2_TEMPLATE, reply, tok.eos_token_id)
    # The template re-renders "now. </s>" where the model sampled "now.</s>": the branch is at
    # the EOS, every token before it shared.
    assert b.divergence is not None and b.divergence.reason == "template_rerendered"
    assert b.divergence.index == len(a.prompt_ids) + len(reply)
    assert (
        b.prompt_ids[: b.divergence.index]
        == (a.prompt_ids + a.completion_ids)[: b.divergence.index]
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_b36_tool_arguments_are_the_decoded_text(tmp_path, stream, anyio_backend):
    """gyre's own call format in a SentencePiece layout: the arguments are the model's exact
    text, spaces and byte pieces included."""
    controls = ("<tool_call>", "</tool_call>")
    tok = sp_tokenizer("metaspace", tmp_path / "m", controls=controls, template=LLAMA2_TEMPLATE)
    reply = '<tool_call>\n{"name": "run", "arguments": {"cmd": "ls -la 读 🎉"}}\n</tool_call>'
    ids = tok.encode(reply, add_special_tokens=False) + [tok.eos_token_id]
    engine = ScriptedEngine([ScriptedReply(token_ids=ids)], vocab_size=len(tok))
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("t")
    tools = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]
    body = {"model": "gyre", "messages": [{"role": "user", "content": "ls"}], "tools": tools}
    status, raw = await asgi_post(proxy, "/v1/chat/completions", key, {**body, "stream": stream})
    assert status == 200, raw
    if stream:
        deltas = [c["choices"][0]["delta"] for c in sse_data(raw)]
        calls = [tc for d in deltas for tc in d.get("tool_calls") or ()]
    else:
        calls = json.loads(raw)["choices"][0]["message"]["tool_calls"]
    decoded = tok.decode(ids[:-1], skip_special_tokens=False)
    assert decoded == reply
    assert [tc["function"]["arguments"] for tc in calls] == ['{"cmd": "ls -la 读 🎉"}']
