"""Streaming and non-streaming record the same tokens; streamed text is exact, UTF-8 included."""

from __future__ import annotations

import json

import httpx
import pytest

from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from gyre.tito.detok import _bytes_to_unicode
from tests.tito.conftest import encode, make_proxy, serving

pytestmark = pytest.mark.anyio


async def sse(http: httpx.AsyncClient, key: str, path: str, body: dict) -> list[dict]:
    out = []
    async with http.stream(
        "POST", path, json={**body, "stream": True}, headers={"Authorization": f"Bearer {key}"}
    ) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
    return out


def byte_tokens(tok, text: str) -> list[int]:
    """One token per UTF-8 byte: every multi-byte character is split across tokens."""
    table = _bytes_to_unicode()
    return [tok.convert_tokens_to_ids(table[b]) for b in text.encode()]


async def test_stream_and_plain_record_identical_ids_and_logprobs(tok, anyio_backend):
    engine = ScriptedEngine(eos_token_id=tok.eos_token_id)  # deterministic in (prompt, seed)
    proxy = make_proxy(tok, engine)
    k1, k2 = proxy.mint_key("plain"), proxy.mint_key("stream")
    body = {
        "model": "gyre",
        "messages": [{"role": "user", "content": "hi"}],
        "seed": 11,
        "n": 2,
        "logprobs": True,
        "return_token_ids": True,
    }
    async with serving(proxy) as base, httpx.AsyncClient(base_url=base) as http:
        plain = (
            await http.post(
                "/chat/completions", json=body, headers={"Authorization": f"Bearer {k1}"}
            )
        ).json()
        chunks = await sse(http, k2, "/chat/completions", body)
    a, b = proxy.calls("plain", full=True), proxy.calls("stream", full=True)
    assert [(c.prompt_ids, c.completion_ids, c.logprobs, c.finish_reason) for c in a] == [
        (c.prompt_ids, c.completion_ids, c.logprobs, c.finish_reason) for c in b
    ]
    for index in range(2):
        ids = [
            t
            for c in chunks
            for ch in c["choices"]
            if ch["index"] == index
            for t in ch["token_ids"]
        ]
        lps = [
            e["logprob"]
            for c in chunks
            for ch in c["choices"]
            if ch["index"] == index
            for e in ch["logprobs"]["content"]
        ]
        assert ids == plain["choices"][index]["token_ids"] == a[index].completion_ids
        assert lps == a[index].logprobs
    assert chunks[0]["prompt_token_ids"] == plain["prompt_token_ids"] == a[0].prompt_ids


async def test_streamed_text_is_the_full_decode_with_split_multibyte_characters(tok, anyio_backend):
    text = "héllo 字 ✓ 🎉 done"
    ids = byte_tokens(tok, text) + [tok.eos_token_id]
    assert len(ids) - 1 == len(text.encode()) > len(text)
    engine = ScriptedEngine([ScriptedReply(token_ids=ids)] * 2, eos_token_id=tok.eos_token_id)
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("utf8")
    body = {"model": "gyre", "messages": [{"role": "user", "content": "say it"}]}
    async with serving(proxy) as base, httpx.AsyncClient(base_url=base) as http:
        chunks = await sse(http, key, "/chat/completions", body)
        plain = (
            await http.post(
                "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            )
        ).json()
    pieces = [ch["delta"].get("content") or "" for c in chunks for ch in c["choices"]]
    assert "".join(pieces) == text == plain["choices"][0]["message"]["content"]
    assert all("\ufffd" not in p for p in pieces)  # no half characters sent
    assert tok.decode(ids[:-1]) == text
    assert proxy.calls("utf8", full=True)[0].completion_ids == ids


async def test_stop_strings_cut_text_and_keep_sampled_tokens(tok, anyio_backend):
    text = "alpha beta STOP gamma delta"
    ids = encode(tok, text) + [tok.eos_token_id]
    engine = ScriptedEngine([ScriptedReply(token_ids=ids)] * 4, eos_token_id=tok.eos_token_id)
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("stop")
    async with serving(proxy) as base, httpx.AsyncClient(base_url=base) as http:
        body = {
            "model": "gyre",
            "messages": [{"role": "user", "content": "go"}],
            "stop": ["STOP", "zzz"],
        }
        plain = (
            await http.post(
                "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            )
        ).json()
        chunks = await sse(http, key, "/chat/completions", body)
        cbody = {"model": "gyre", "prompt": "go", "stop": "STOP", "max_tokens": 50}
        comp = (
            await http.post("/completions", json=cbody, headers={"Authorization": f"Bearer {key}"})
        ).json()
        cchunks = await sse(http, key, "/completions", cbody)
    assert plain["choices"][0]["message"]["content"] == "alpha beta "
    assert plain["choices"][0]["finish_reason"] == "stop"
    assert (
        "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])
        == "alpha beta "
    )
    assert (
        comp["choices"][0]["text"]
        == "alpha beta "
        == "".join(ch["text"] for c in cchunks for ch in c["choices"])
    )
    calls = proxy.calls("stop", full=True)
    # Recorded: every sampled token up to the one that completed "STOP", nothing after it.
    n = next(i for i in range(len(ids)) if "STOP" in tok.decode(ids[: i + 1]))
    for call in calls:
        assert call.completion_ids == ids[: n + 1] and call.finish_reason == "stop"
        assert len(call.logprobs) == n + 1
    # The same request again is a sibling (same prompt IDs, same parent), not a divergence.
    assert calls[1].prompt_ids == calls[0].prompt_ids and calls[1].parent_call_id is None
    assert all(call.divergence is None for call in calls)


async def test_client_gone_mid_stream_keeps_the_sampled_tokens_as_abort(tok, anyio_backend):
    import anyio

    ids = encode(tok, "word " * 50) + [tok.eos_token_id]
    engine = ScriptedEngine(
        [ScriptedReply(token_ids=ids)], eos_token_id=tok.eos_token_id, token_delay_s=0.01
    )
    proxy = make_proxy(tok, engine, retry_window_s=0.2)  # no retry comes: recorded after 0.2 s
    key = proxy.mint_key("gone")
    body = {"model": "gyre", "messages": [{"role": "user", "content": "x"}], "stream": True}
    async with serving(proxy) as base:
        async with httpx.AsyncClient(base_url=base) as http:
            async with http.stream(
                "POST", "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            ) as r:
                got = []
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        got += json.loads(line[6:])["choices"][0]["token_ids"]
                    if len(got) >= 3:
                        break  # the agent goes away mid-reply
        with anyio.fail_after(10):
            while not proxy.calls("gone", full=True):
                await anyio.sleep(0.02)
    call = proxy.calls("gone", full=True)[0]
    assert call.finish_reason == "abort"
    assert call.completion_ids[: len(got)] == got == ids[: len(got)]
    assert len(call.logprobs) == len(call.completion_ids) < len(ids)


async def _drop_after(base: str, key: str, body: dict, tokens: int) -> list[int]:
    """Stream `body` and go away after `tokens` tokens (a client timeout, a dropped connection)."""
    async with httpx.AsyncClient(base_url=base) as http:
        async with http.stream(
            "POST", "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as r:
            got: list[int] = []
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    got += json.loads(line[6:])["choices"][0]["token_ids"]
                if len(got) >= tokens:
                    return got
    return got


async def test_a_retry_of_a_dropped_stream_is_one_logical_call(tok, anyio_backend):
    """Issue 18 (faults.json `stream_drop`): the stream drops after 3 tokens and the client sends
    the same request again: one record, the retry's, and no partial sibling in the tree. A drop
    followed by a different request keeps the partial call held (its retry may still come: one
    execution may send requests in parallel) until the window or the execution ends (B41)."""
    import anyio

    first = encode(tok, "word " * 40) + [tok.eos_token_id]
    again = encode(tok, "done now") + [tok.eos_token_id]
    other = encode(tok, "other") + [tok.eos_token_id]
    engine = ScriptedEngine(
        [ScriptedReply(token_ids=t) for t in (first, again, first, other)],
        eos_token_id=tok.eos_token_id,
        token_delay_s=0.01,
    )
    proxy = make_proxy(tok, engine)  # the default window, 30 s
    body = {"model": "gyre", "messages": [{"role": "user", "content": "x"}], "stream": True}
    retry, ex2 = proxy.mint_key("retry"), proxy.mint_key("moved-on")
    async with serving(proxy) as base:
        assert await _drop_after(base, retry, body, 3) == first[:3]
        with anyio.fail_after(10):
            while proxy.statistics().disconnect_aborts < 1:
                await anyio.sleep(0.02)
        async with httpx.AsyncClient(base_url=base) as http:
            r = await http.post(
                "/chat/completions",
                json=dict(body, stream=False),
                headers={"Authorization": f"Bearer {retry}"},
            )
            assert r.status_code == 200, r.text
        # the non-streamed body differs from the dropped one (not a retry of it): this one is
        # recorded, the partial call stays held; ending the execution records it
        assert [c.completion_ids for c in proxy.calls("retry")] == [again]
        assert proxy.statistics().held == 1
        _, calls = await proxy.end("retry")
        assert [c.finish_reason for c in calls] == ["stop", "abort"]
        assert calls[1].completion_ids == first[: len(calls[1].completion_ids)]

        assert await _drop_after(base, ex2, body, 3) == first[:3]
        with anyio.fail_after(10):
            while proxy.statistics().disconnect_aborts < 2:
                await anyio.sleep(0.02)
        assert proxy.calls("moved-on") == []  # held for a retry
        got = await _drop_after(base, ex2, body, 10**6)  # the same request again, read to the end
        assert got == other
    (call,) = proxy.calls("moved-on")
    assert call.finish_reason == "stop" and call.completion_ids == other
    stats = proxy.statistics()
    assert (stats.disconnect_aborts, stats.retries_superseded) == (2, 1)


class ScopedEngine(ScriptedEngine):
    """Holds a cancel scope across its yields, as the cell client does (bounded waits)."""

    async def generate(self, request):
        import anyio

        with anyio.fail_after(60):
            async for delta in super().generate(request):
                yield delta


async def test_engines_holding_cancel_scopes_across_yields_stream_fine(tok, anyio_backend):
    ids = encode(tok, "one two three") + [tok.eos_token_id]
    engine = ScopedEngine([ScriptedReply(token_ids=ids)] * 3, eos_token_id=tok.eos_token_id)
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("scoped")
    body = {"model": "gyre", "messages": [{"role": "user", "content": "count"}]}
    async with serving(proxy) as base, httpx.AsyncClient(base_url=base) as http:
        chunks = await sse(http, key, "/chat/completions", body)
        plain = (
            await http.post(
                "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            )
        ).json()
        text = await sse(
            http, key, "/completions", {"model": "gyre", "prompt": "count", "max_tokens": 8}
        )
    assert (
        [t for c in chunks for ch in c["choices"] for t in ch["token_ids"]]
        == ids
        == plain["choices"][0]["token_ids"]
    )
    assert "".join(ch["text"] for c in text for ch in c["choices"]) == "one two three"


async def test_a_plain_call_stops_the_engine_at_the_token_that_completes_a_stop_string(
    tok, anyio_backend
):
    """Non-streamed calls read the engine in their own task (`run_to_end`): the engine stops
    before it samples past the token that completed the stop string."""
    text = "alpha beta STOP gamma delta"
    ids = encode(tok, text) + [tok.eos_token_id]
    n = next(i for i in range(len(ids)) if "STOP" in tok.decode(ids[: i + 1]))
    engine = ScriptedEngine([ScriptedReply(token_ids=ids)] * 2, eos_token_id=tok.eos_token_id)
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("stop")
    headers = {"Authorization": f"Bearer {key}"}
    async with serving(proxy) as base, httpx.AsyncClient(base_url=base) as http:
        chat = {"model": "gyre", "messages": [{"role": "user", "content": "go"}], "stop": "STOP"}
        assert (await http.post("/chat/completions", json=chat, headers=headers)).status_code == 200
        comp = {"model": "gyre", "prompt": "go", "stop": ["zzz", "STOP"], "max_tokens": 50}
        assert (await http.post("/completions", json=comp, headers=headers)).status_code == 200
    stats = engine.statistics()
    assert stats.requests_total == 2 and stats.tokens_generated == 2 * (n + 1) < 2 * len(ids)


async def test_stop_string_spread_over_many_tokens(tok, anyio_backend):
    text = "alpha beta STOP gamma"
    ids = byte_tokens(tok, text) + [tok.eos_token_id]  # one token per character
    engine = ScriptedEngine([ScriptedReply(token_ids=ids)] * 2, eos_token_id=tok.eos_token_id)
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("spread")
    body = {"model": "gyre", "messages": [{"role": "user", "content": "go"}], "stop": ["STOP"]}
    async with serving(proxy) as base, httpx.AsyncClient(base_url=base) as http:
        chunks = await sse(http, key, "/chat/completions", body)
        plain = (
            await http.post(
                "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            )
        ).json()
    streamed = "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])
    assert streamed == plain["choices"][0]["message"]["content"] == "alpha beta "
    for call in proxy.calls("spread", full=True):
        assert call.completion_ids == ids[: len("alpha beta STOP")] and call.finish_reason == "stop"
