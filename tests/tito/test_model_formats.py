"""Model formats through vLLM's own parsers (`gyre.tito.model_format`): per family (tiny
tokenizers in Qwen, Llama 3, Mistral and DeepSeek token layouts, `tests/tito/families.py`), a
multi-turn tool conversation through the proxy stays one path and its tool calls and reasoning
come back parsed; stop IDs come from `generation_config.json`; arguments reach the template in
the form it expects."""

from __future__ import annotations

import json

import httpx
import pytest

from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from gyre.errors import ConfigError
from gyre.tito.model_format import ModelFormat, generation_stop_ids
from tests.tito.conftest import make_proxy, serving
from tests.tito.families import FAMILIES, family_tokenizer

pytestmark = pytest.mark.anyio

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    name = request.param
    return name, family_tokenizer(name, tmp_path_factory.mktemp(name))


def ids_of(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


async def test_family_conversation_is_one_path(family, anyio_backend):
    name, tok = family
    fam = FAMILIES[name]
    eos = tok.eos_token_id
    c0 = ids_of(tok, fam.call_reply) + [eos]
    c1 = ids_of(tok, fam.final_reply) + [eos]
    engine = ScriptedEngine(
        [ScriptedReply(token_ids=c0), ScriptedReply(token_ids=c1), ScriptedReply(token_ids=c1)],
        eos_token_id=eos,
        vocab_size=len(tok),
    )
    proxy = make_proxy(
        tok, engine, tool_parser=fam.tool_parser, reasoning_parser=fam.reasoning_parser
    )
    assert proxy.renderer.arguments_as == fam.arguments_as
    key = proxy.mint_key("x")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Read a.py."}]
    async with serving(proxy) as base, httpx.AsyncClient(base_url=base) as http:

        async def ask() -> dict:
            body = {"model": "gyre", "messages": msgs, "tools": TOOLS}
            r = await http.post(
                "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            )
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]

        first = await ask()
        m = first["message"]
        assert first["finish_reason"] == "tool_calls"
        assert [
            (tc["function"]["name"], json.loads(tc["function"]["arguments"]))
            for tc in m["tool_calls"]
        ] == [("read_file", {"path": "a.py"})]
        assert m.get("reasoning_content") == fam.reasoning
        msgs += [m, {"role": "tool", "tool_call_id": m["tool_calls"][0]["id"], "content": "x = 1"}]
        second = await ask()
        assert second["finish_reason"] == "stop" and "tool_calls" not in second["message"]
        assert second["message"]["content"] == fam.final_content
        msgs += [second["message"], {"role": "user", "content": "Thanks."}]
        await ask()
    calls = proxy.calls("x", full=True)
    assert [(c.parent_call_id, c.divergence) for c in calls] == [
        (None, None),
        ("c0", None),
        ("c1", None),
    ]
    assert calls[0].completion_ids == c0 and calls[1].completion_ids == c1
    # One path: each prompt extends the previous prompt + completion, token for token.
    for a, b in zip(calls, calls[1:]):
        known = a.prompt_ids + a.completion_ids
        assert b.prompt_ids[: len(known)] == known
    # Every fast-path prompt was cross-checked against a full render (render_check_every=1).
    stats = proxy.renderer.stats
    assert (stats.fast, stats.check_failures, stats.divergences) == (0, 0, 0)
    assert stats.checks == 2


def test_stop_ids_come_from_generation_config(tmp_path):
    _, tok = "llama3", family_tokenizer("llama3", tmp_path / "llama3")
    ends = tok.convert_tokens_to_ids(["<|eot_id|>", "<|end_of_text|>", "<|eom_id|>"])
    assert generation_stop_ids(tok) == tuple(ends)  # the tokenizer's EOS first, no repeat
    (tmp_path / "llama3" / "generation_config.json").write_text('{"eos_token_id": 7}')
    assert generation_stop_ids(tok) == (ends[0], 7)
    (tmp_path / "llama3" / "generation_config.json").write_text('{"eos_token_id": [-1]}')
    with pytest.raises(ConfigError, match="eos_token_id"):
        generation_stop_ids(tok)


async def test_proxy_stops_on_every_end_id(tmp_path, anyio_backend):
    tok = family_tokenizer("llama3", tmp_path / "llama3")
    eom = tok.convert_tokens_to_ids("<|eom_id|>")
    engine = ScriptedEngine(
        [ScriptedReply(token_ids=ids_of(tok, "one two") + [eom] + ids_of(tok, "three"))],
        vocab_size=len(tok),
    )
    proxy = make_proxy(tok, engine, tool_parser="llama3_json", reasoning_parser="none")
    key = proxy.mint_key("s")
    async with serving(proxy) as base, httpx.AsyncClient(base_url=base) as http:
        body = {"model": "gyre", "messages": [{"role": "user", "content": "count"}]}
        r = await http.post(
            "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        )
    choice = r.json()["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("one two", "stop")
    assert proxy.calls("s", full=True)[0].completion_ids == ids_of(tok, "one two") + [eom]


def test_unknown_parser_is_a_config_error(tok):
    with pytest.raises(ConfigError, match="tool_parser='nope' is not one of: .*hermes"):
        ModelFormat.load(tok, tool_parser="nope")
    with pytest.raises(ConfigError, match="reasoning_parser='nope'"):
        ModelFormat.load(tok, tool_parser="hermes", reasoning_parser="nope")
    with pytest.raises(ConfigError, match="cannot use this tokenizer"):
        ModelFormat.load(tok, tool_parser="deepseek_v3")  # its markers are not in the vocabulary


async def test_streamed_reply_equals_the_whole_one(tmp_path, anyio_backend):
    """vLLM-parsed replies stream their token IDs per delta and their text when the choice
    ends (`HeldStream`); the streamed message is the non-streamed one."""
    tok = family_tokenizer("qwen", tmp_path / "qwen")
    fam = FAMILIES["qwen"]
    c0 = ids_of(tok, fam.call_reply) + [tok.eos_token_id]
    engine = ScriptedEngine(
        [ScriptedReply(token_ids=c0)] * 2, eos_token_id=tok.eos_token_id, vocab_size=len(tok)
    )
    proxy = make_proxy(tok, engine, tool_parser="hermes", reasoning_parser="qwen3")
    body = {"model": "gyre", "messages": [{"role": "user", "content": "Read."}], "tools": TOOLS}
    async with serving(proxy) as base, httpx.AsyncClient(base_url=base) as http:
        headers = {"Authorization": f"Bearer {proxy.mint_key('w')}"}
        whole = (await http.post("/chat/completions", json=body, headers=headers)).json()
        headers = {"Authorization": f"Bearer {proxy.mint_key('s')}"}
        r = await http.post("/chat/completions", json=body | {"stream": True}, headers=headers)
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    deltas = [c["choices"][0] for c in chunks if c["choices"]]
    assert sum((d["token_ids"] for d in deltas), []) == c0
    last = deltas[-1]["delta"]
    msg = whole["choices"][0]["message"]
    assert last["reasoning_content"] == msg["reasoning_content"] == fam.reasoning
    assert [dict(tc, index=0) for tc in msg["tool_calls"]] == [
        dict(tc, id=msg["tool_calls"][0]["id"]) for tc in last["tool_calls"]
    ]
    assert deltas[-1]["finish_reason"] == "tool_calls"
    assert all(
        "content" not in d["delta"] and "reasoning_content" not in d["delta"] for d in deltas[:-1]
    )
