"""One call lifecycle (docs/design.md, "One call lifecycle"): a client's retry of a call it timed
out on is served and recorded once (field case B41), streamed or not. Virtual time (trio's
`MockClock`), scripted engines."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
import trio.testing

from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from gyre.tito.log import CallEntry, read_log
from tests.tito.conftest import asgi_post, encode, make_proxy
from tests.tito.test_inflight import frames

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"


@pytest.fixture
def anyio_backend(monkeypatch):
    """trio with a virtual clock: a sleep returns as soon as every task waits (no real time).
    Thread hops (the log's fsync) run inline: the clock would jump past every timer while a
    thread runs."""

    async def inline(fn, *args, **_):
        return fn(*args)

    monkeypatch.setattr(anyio.to_thread, "run_sync", inline)
    return "trio", {"clock": trio.testing.MockClock(autojump_threshold=0)}


class StalledEngine(ScriptedEngine):
    """A stalled (slow) engine: a token every `token_delay_s`, and an abort that takes `abort_s`
    (the round trip to a cell) before it stops the request; its EOS comes `eos_after_s` later
    than the other tokens would."""

    def __init__(self, *args, abort_s: float = 0.0, eos_after_s: float = 0.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.abort_s, self.eos_after_s = abort_s, eos_after_s

    async def generate(self, request):
        async for delta in super().generate(request):
            if self.eos_after_s and self.eos_token_id in delta.token_ids:
                await anyio.sleep(self.eos_after_s)
            yield delta

    async def abort(self, request_id: str):
        with anyio.CancelScope(shield=True):
            await anyio.sleep(self.abort_s)
        return await super().abort(request_id)


def body(stream: bool, content: str = "write") -> dict:
    return {"model": "gyre", "messages": [{"role": "user", "content": content}], "stream": stream}


def token_ids(raw: bytes, stream: bool) -> list[int]:
    """The completion token IDs a response carried (gyre's `token_ids` field), whole or as SSE."""
    if not stream:
        return json.loads(raw)["choices"][0]["token_ids"]
    out = []
    for line in raw.decode().splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                out += choice["token_ids"]
    return out


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_b41_a_retry_of_a_timed_out_call_is_served_fresh_and_recorded_once(
    tok, anyio_backend, tmp_path: Path, stream: bool
):
    """B41: the client times out after 1 s and sends the same body again at once, while the proxy
    is still aborting the first call (the engine's abort takes 0.1 s). The retry must not join the
    dying call: it is served as a fresh call (200, every token), and the log holds exactly one
    record of the logical call, the retry's; the first call's partial sample is dropped."""
    ids = encode(tok, " word" * 20)[:20] + [tok.eos_token_id]
    engine = StalledEngine(
        [ScriptedReply(token_ids=ids), ScriptedReply(token_ids=ids)],
        eos_token_id=tok.eos_token_id,
        token_delay_s=0.2,
        abort_s=0.1,
    )
    proxy = make_proxy(tok, engine, log_path=str(tmp_path / "calls.log"))
    key = proxy.mint_key("b41")
    out = {}
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:

            async def first() -> None:
                out["first"] = await asgi_post(proxy, CHAT, key, body(stream), gone_after_s=1.0)

            tg.start_soon(first)
            await anyio.sleep(1.0)  # the client's timeout; the proxy sees it leave
            while proxy.statistics().disconnect_aborts < 1:
                await anyio.sleep(0.001)
            out["retry"] = await asgi_post(proxy, CHAT, key, body(stream))
        summary = await proxy.close("b41")
    status, raw = out["retry"]
    assert status == 200, raw
    assert token_ids(raw, stream) == ids
    stats = proxy.statistics()
    assert (stats.disconnect_aborts, stats.retries_joined) == (1, 0)  # aborted, never joined
    assert len(engine.requests_seen) == 2  # the retry ran as a fresh call
    entries = [e for e in frames(tmp_path / "calls.log") if isinstance(e, CallEntry)]
    assert [(e.call.completion_ids, e.call.finish_reason) for e in entries] == [(ids, "stop")]
    assert summary.num_calls == 1
    assert read_log(tmp_path / "calls.log").for_execution("b41") == [e.call for e in entries]
