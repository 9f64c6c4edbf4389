"""Calls in flight: a disconnect aborts the engine request in both modes, closing an execution
records its calls before its end entry (field case B29), and a client's retry is one call."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import anyio
import httpx
import msgspec
import pytest

from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from gyre.tito.log import CallEntry, EndEntry, read_log
from tests.tito.conftest import asgi_post, encode, make_proxy, serving

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"


def frames(path: Path) -> list[CallEntry | EndEntry]:
    """Every entry of a call log in the order written."""
    data, out, pos = path.read_bytes(), [], 0
    decoder = msgspec.msgpack.Decoder(CallEntry | EndEntry)
    while pos < len(data):
        length, _ = struct.unpack_from("<II", data, pos)
        out.append(decoder.decode(data[pos + 8 : pos + 8 + length]))
        pos += 8 + length
    return out


def slow_engine(tok, tokens: int = 200, delay_s: float = 0.02) -> tuple[ScriptedEngine, list[int]]:
    """B29's engine: a `tokens`-token reply at `delay_s` a token."""
    ids = (encode(tok, " word" * tokens))[:tokens]
    assert len(ids) == tokens
    reply = ScriptedReply(token_ids=ids)
    return ScriptedEngine([reply], eos_token_id=tok.eos_token_id, token_delay_s=delay_s), ids


def body(stream: bool) -> dict:
    return {"model": "gyre", "messages": [{"role": "user", "content": "write"}], "stream": stream}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_b29_disconnect_aborts_the_engine_request_in_both_modes(
    tok, anyio_backend, tmp_path: Path, stream: bool
):
    engine, ids = slow_engine(tok)
    proxy = make_proxy(tok, engine, log_path=str(tmp_path / "calls.log"))
    key = proxy.mint_key("b29")
    with anyio.fail_after(30):
        # The client leaves once 10 tokens were sampled (a timer alone could fire before the
        # first token on a loaded machine, and a call with no token records nothing).
        sampled = lambda: engine.statistics().tokens_generated >= 10  # noqa: E731
        status, _ = await asgi_post(proxy, CHAT, key, body(stream), gone_when=sampled)
        summary = await proxy.close("b29")
    assert status == (200 if stream else 499)
    stats = proxy.statistics()
    assert (stats.disconnect_aborts, stats.close_aborts, stats.in_flight) == (1, 0, 0)
    engine_stats = engine.statistics()  # the engine stopped: it did not sample the 200 tokens
    assert engine_stats.running_requests == 0 and engine_stats.tokens_generated < len(ids)
    entries = frames(tmp_path / "calls.log")
    assert [type(e) for e in entries] == [CallEntry, EndEntry]  # recorded once, before the end
    call = entries[0].call
    assert call.finish_reason == "abort"
    assert 0 < len(call.completion_ids) < len(ids)  # about 10 of 200 (timing: not asserted)
    assert call.completion_ids == ids[: len(call.completion_ids)]
    # A resumed run reads exactly the calls the step read: the summary counts the record.
    assert summary.num_calls == 1 and read_log(tmp_path / "calls.log").for_execution("b29") == [
        call
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_b29_closing_the_execution_records_its_calls_before_the_end_entry(
    tok, anyio_backend, tmp_path: Path, stream: bool
):
    """The variant: the execution is closed right after its agent is killed (the connection is
    still open: the proxy has not seen the disconnect yet)."""
    engine, ids = slow_engine(tok)
    proxy = make_proxy(tok, engine, log_path=str(tmp_path / "calls.log"))
    key = proxy.mint_key("b29")
    result = {}
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:

            async def agent() -> None:
                result["status"], result["body"] = await asgi_post(proxy, CHAT, key, body(stream))

            tg.start_soon(agent)
            # Close once 10 tokens were sampled, not after a fixed time: on a loaded machine
            # (CI) a timer could fire before the first token, and a call with no token records
            # nothing. Each token waits on a timer, so the proxy took the first ones by then.
            while engine.statistics().tokens_generated < 10:
                await anyio.sleep(0.005)
            summary = await proxy.close("b29")
    entries = frames(tmp_path / "calls.log")
    assert [type(e) for e in entries] == [CallEntry, EndEntry]
    assert entries[0].call.finish_reason == "abort"
    assert 0 < len(entries[0].call.completion_ids) < 200
    assert summary.num_calls == 1
    stats = proxy.statistics()
    assert (stats.close_aborts, stats.disconnect_aborts, stats.records_dropped_closed) == (1, 0, 0)
    if not stream:
        assert result["status"] == 409
        assert json.loads(result["body"])["error"]["code"] == "execution_closed"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_a_record_begun_under_a_cancel_is_written_whole(
    tok, anyio_backend, tmp_path: Path, stream: bool
):
    """B29's cause in a streamed call: closing the execution cancels the stream's producer, the
    stream then ends as if finished and records the call inside the cancelled scope. The record
    marks the call recorded first, so a cancel at its log append lost it (only the end entry was
    written). Here every record starts under a cancel: each is still written, to log and memory."""
    engine, ids = slow_engine(tok, tokens=12, delay_s=0.0)
    proxy = make_proxy(tok, engine, log_path=str(tmp_path / "calls.log"))
    record = proxy.recorder.record

    async def record_under_a_cancel(call, replies):
        with anyio.CancelScope() as scope:
            scope.cancel()
            return await record(call, replies)

    proxy.recorder.record = record_under_a_cancel
    key = proxy.mint_key("cancelled")
    with anyio.fail_after(30):
        status, _ = await asgi_post(proxy, CHAT, key, body(stream))
        summary = await proxy.close("cancelled")
    assert status == 200
    entries = frames(tmp_path / "calls.log")
    assert [type(e) for e in entries] == [CallEntry, EndEntry]
    assert entries[0].call.completion_ids == ids and summary.num_calls == 1


async def test_identical_concurrent_requests_of_one_execution_are_one_call(tok, anyio_backend):
    engine, ids = slow_engine(tok, tokens=20, delay_s=0.01)
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("retry")
    results = []

    async def client() -> None:
        results.append(await asgi_post(proxy, CHAT, key, body(False)))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(client)
            while not engine.requests_seen:
                await anyio.sleep(0.005)
            tg.start_soon(client)  # the client's retry, sent while the first is generating
    assert len(results) == 2 and results[0] == results[1] and results[0][0] == 200
    reply = json.loads(results[0][1])
    assert reply["choices"][0]["token_ids"] == ids
    calls = proxy.calls("retry")
    assert len(calls) == 1 and calls[0].completion_ids == ids
    assert len(engine.requests_seen) == 1
    stats = proxy.statistics()
    assert (stats.retries_joined, stats.calls_recorded, stats.requests_total) == (1, 1, 2)


async def test_a_retry_with_the_same_idempotency_key_outlives_the_first_clients_timeout(
    tok, anyio_backend
):
    """The first client gives up (disconnects); its retry, sent later with the same key, joins the
    call still generating; a retry after the call finished gets the same response again."""
    engine, ids = slow_engine(tok, tokens=30, delay_s=0.01)
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("idem")
    idem = {"Idempotency-Key": "k-1"}
    out = {}
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:

            async def first() -> None:
                out["first"] = await asgi_post(
                    proxy, CHAT, key, body(False), gone_after_s=0.05, headers=idem
                )

            tg.start_soon(first)
            while not engine.requests_seen:
                await anyio.sleep(0.005)
            await anyio.sleep(0.1)  # the first client is gone by now
            retry = {**idem, "X-Stainless-Retry-Count": "1"}
            out["retry"] = await asgi_post(proxy, CHAT, key, body(False), headers=retry)
        out["again"] = await asgi_post(proxy, CHAT, key, body(False), headers=idem)
        other = await asgi_post(proxy, CHAT, key, {**body(False), "seed": 1}, headers=idem)
    assert out["retry"][0] == 200 and out["retry"] == out["again"]
    assert json.loads(out["retry"][1])["choices"][0]["token_ids"] == ids
    assert len(proxy.calls("idem")) == 1 and len(engine.requests_seen) == 1
    assert other[0] == 422 and json.loads(other[1])["error"]["code"] == "idempotency_key_reused"
    stats = proxy.statistics()
    assert (stats.retries_joined, stats.disconnect_aborts, stats.client_retries) == (2, 0, 1)


async def test_b29_a_real_client_timeout_aborts_a_plain_request(tok, anyio_backend):
    """The same through Hypercorn: httpx gives up after 0.3 s and closes the connection. No retry
    comes within `retry_window_s` (0.2 s here): the partial sample is recorded."""
    engine, ids = slow_engine(tok)
    proxy = make_proxy(tok, engine, retry_window_s=0.2)
    key = proxy.mint_key("b29")
    async with serving(proxy) as base, httpx.AsyncClient(base_url=base, timeout=0.3) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.post(
                "/chat/completions", json=body(False), headers={"Authorization": f"Bearer {key}"}
            )
        with anyio.fail_after(10):
            while not proxy.calls("b29"):
                await anyio.sleep(0.02)
    (call,) = proxy.calls("b29")
    assert call.finish_reason == "abort" and len(call.completion_ids) < len(ids)
    assert proxy.statistics().disconnect_aborts == 1


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_a_client_gone_before_the_first_token_is_noticed_at_once(
    tok, anyio_backend, stream: bool
):
    """Issue 18: a client that gave up before the first token was noticed only at the router's
    attempt timeout. The first token here would come after 30 s; the client leaves at 0.1 s."""
    engine, _ = slow_engine(tok, tokens=5, delay_s=30.0)
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("early")
    with anyio.fail_after(10):
        status, _ = await asgi_post(proxy, CHAT, key, body(stream), gone_after_s=0.1)
    assert status == (499 if not stream else 0)  # streamed: nothing was sent yet
    stats = proxy.statistics()
    assert (stats.disconnect_aborts, stats.in_flight, stats.calls_recorded) == (1, 0, 0)
    assert engine.statistics().running_requests == 0


async def test_a_joined_call_outlives_its_first_client_and_aborts_with_its_last(tok, anyio_backend):
    """The first client leaves while its retry waits: the call goes on for the retry. When the
    last waiting client leaves too, the engine request is aborted."""
    engine, ids = slow_engine(tok, tokens=30, delay_s=0.01)
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("join")
    out = {}
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:

            async def first() -> None:
                out["first"] = await asgi_post(proxy, CHAT, key, body(False), gone_after_s=0.1)

            tg.start_soon(first)
            while not engine.requests_seen:
                await anyio.sleep(0.005)
            out["retry"] = await asgi_post(proxy, CHAT, key, body(False))
    # The first handler still produced the response (its client was not there to read it).
    assert out["retry"][0] == 200 and out["first"] == out["retry"]
    assert json.loads(out["retry"][1])["choices"][0]["token_ids"] == ids
    (call,) = proxy.calls("join")
    assert call.finish_reason == "stop" and call.completion_ids == ids
    stats = proxy.statistics()
    assert (stats.retries_joined, stats.disconnect_aborts) == (1, 0)

    engine.push(ScriptedReply(token_ids=ids))
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for gone_after_s in (0.05, 0.1):
                tg.start_soon(
                    lambda s=gone_after_s: asgi_post(proxy, CHAT, key, body(False), gone_after_s=s)
                )
    assert len(proxy.calls("join")) == 1  # the aborted call waits for a retry of its request
    stats = proxy.statistics()
    assert (stats.retries_joined, stats.disconnect_aborts) == (2, 1)
    summary = await proxy.close("join")  # no retry can come now: it is recorded before the end
    assert summary.num_calls == 2 and proxy.statistics().retries_superseded == 0


async def test_b29_a_streamed_responses_call_is_aborted_before_its_request_ends(
    tok, anyio_backend, tmp_path: Path
):
    """B29 through the Responses API, which streams by translating a chat stream: when the client
    leaves, the engine has stopped by the time the request returns (read before any other task
    runs), and closing the execution records what was sampled, once, before the end entry. (The
    translation also closes the chat stream itself, 7a8b91f; this test passes without that too:
    the stream's cleanup ran in time from its finalizer.)"""
    engine, ids = slow_engine(tok)
    proxy = make_proxy(tok, engine, log_path=str(tmp_path / "calls.log"))
    key = proxy.mint_key("b29")
    request = {"model": "gyre", "input": "write", "stream": True}
    with anyio.fail_after(30):
        sampled = lambda: engine.statistics().tokens_generated >= 10  # noqa: E731
        status, _ = await asgi_post(proxy, "/v1/responses", key, request, gone_when=sampled)
        # no checkpoint between the request's end and these reads
        stats, engine_stats = proxy.statistics(), engine.statistics()
        summary = await proxy.close("b29")
    assert status == 200
    assert (stats.disconnect_aborts, stats.in_flight) == (1, 0)
    assert engine_stats.running_requests == 0 and engine_stats.tokens_generated < len(ids)
    entries = frames(tmp_path / "calls.log")
    assert [type(e) for e in entries] == [CallEntry, EndEntry]
    call = entries[0].call
    assert call.finish_reason == "abort"
    assert 0 < len(call.completion_ids) < len(ids)
    assert call.completion_ids == ids[: len(call.completion_ids)]
    assert summary.num_calls == 1
