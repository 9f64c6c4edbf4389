"""Slow tier: constraints on real vLLM (a cell, through the proxy): `tool_choice=required` gives
a tool call in 10 of 10 replies, `response_format=json_schema` output parses and validates, and
greedy `top_logprobs=3` returns 3 entries whose first is the sampled token with its logprob."""

from __future__ import annotations

import json

import pytest

import tests.conftest as shared_fixtures
from tests.tito.conftest import make_proxy, serving

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
if not hasattr(shared_fixtures, "vllm_engine"):
    pytestmark.append(pytest.mark.skip(reason="the `vllm_engine` fixture is not defined"))

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "ping",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
    }
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # one backend: the shared cell is what costs


async def test_constraints_on_vllm(vllm_engine, anyio_backend):
    import openai
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(vllm_engine.tokenizer_dir))
    proxy = make_proxy(tok, vllm_engine)
    key = proxy.mint_key("constraints")
    messages = [{"role": "user", "content": "Call ping."}]
    async with serving(proxy) as base:
        client = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0, timeout=300)
        calls = 0
        for seed in range(10):
            r = await client.chat.completions.create(
                model="gyre",
                messages=messages,
                tools=TOOLS,
                tool_choice="required",
                parallel_tool_calls=False,  # one call, then the grammar ends (random weights)
                max_tokens=64,
                temperature=1.0,
                seed=seed,
            )
            tc = r.choices[0].message.tool_calls or []
            calls += bool(tc) and all(t.function.name == "ping" for t in tc)
        assert calls == 10

        r = await client.chat.completions.create(
            model="gyre",
            messages=[{"role": "user", "content": "Count."}],
            max_tokens=8,
            temperature=0.0,
            logprobs=True,
            top_logprobs=3,
        )
        content = r.choices[0].logprobs.content
        assert len(content) == len(r.choices[0].model_extra["token_ids"]) > 0
        for entry in content:
            assert len(entry.top_logprobs) == 3
            top = entry.top_logprobs[0]
            assert top.bytes == entry.bytes
            assert top.logprob == pytest.approx(entry.logprob, abs=1e-5)
            assert [e.logprob for e in entry.top_logprobs] == sorted(
                (e.logprob for e in entry.top_logprobs), reverse=True
            )
        await client.close()


async def test_response_format_json_schema_on_vllm(vllm_engine, anyio_backend):
    import openai
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(vllm_engine.tokenizer_dir))
    proxy = make_proxy(tok, vllm_engine)
    key = proxy.mint_key("json")
    async with serving(proxy) as base:
        client = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0, timeout=300)
        schema = {
            "type": "object",
            "properties": {"ok": {"type": "boolean"}},
            "required": ["ok"],
            "additionalProperties": False,
        }
        for seed in range(3):
            r = await client.chat.completions.create(
                model="gyre",
                messages=[{"role": "user", "content": "Answer in JSON."}],
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "answer", "schema": schema},
                },
                max_tokens=64,
                temperature=1.0,
                seed=seed,
            )
            obj = json.loads(r.choices[0].message.content)
            assert set(obj) == {"ok"} and isinstance(obj["ok"], bool)

        await client.close()
