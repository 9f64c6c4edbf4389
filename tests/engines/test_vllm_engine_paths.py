"""`VLLMEngine`'s request paths over a scripted stand-in for vLLM's `AsyncLLM`: a one-choice
request driven in its consumer's task, several choices each in a task of their own, the request
deadline on both, an abort mid-stream, and a weight load racing a request that reaches vLLM after
its pause (field case B32). The real engine is `test_vllm.py`'s (slow tier)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import vllm.inputs  # noqa: F401 - imported here, not by the first request: it takes seconds,
import vllm.sampling_params  # noqa: F401 - longer than the deadlines below
from vllm.logprobs import FlatLogprobs

from gyre.config import EngineConfig, KVTransferConfig
from gyre.engines import Completion, GenerateRequest, SamplingParams, TokenDelta, collect
from gyre.engines.vllm_engine import VLLMEngine
from gyre.errors import EngineTimeoutError, EngineUnavailableError

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the cell's loop: VLLMEngine is asyncio-only


class FakeLLM:
    """`AsyncLLM.generate`/`abort` as gyre uses them: DELTA outputs of one token each, token k of
    a sub-request being `first + k` (first: 100) with logprob `-0.5 * (k + 1)` (vLLM's
    `FlatLogprobs`: gyre asks for flat logprobs; a request for other logprobs is refused); a
    first attempt (sub-request ID ending in /0) waits after `stall_after` tokens until aborted,
    then ends with finish reason "abort" (what vLLM does), its last output carrying the next
    `unsent` tokens: sampled, not yet handed over (vLLM's `stream_interval` > 1); a consumer that
    leaves aborts it too."""

    def __init__(
        self,
        tokens: int,
        stall_after: int | None = None,
        step_s: float = 0.0,
        first: int = 100,
        unsent: int = 0,
    ) -> None:
        self.tokens = tokens
        self.first = first
        self.stall_after = stall_after
        self.unsent = unsent
        self.step_s = step_s  # seconds per token (an engine step)
        self.aborted: list[str] = []
        self._abort_events: dict[str, asyncio.Event] = {}

    async def generate(self, prompt, params, sub_id):
        if params.logprobs is not None and not params.flat_logprobs:
            raise ValueError("FakeLLM only gives flat logprobs")
        try:
            async for out in self._outputs(sub_id):
                yield out
        except (GeneratorExit, asyncio.CancelledError):
            self.aborted.append(sub_id)  # vLLM aborts a request whose consumer left
            raise

    async def _outputs(self, sub_id):
        aborted = self._abort_events.setdefault(sub_id, asyncio.Event())
        held: range = range(0)
        for k in range(self.tokens):
            if aborted.is_set():
                break
            if self.stall_after == k and sub_id.endswith("/0"):
                await aborted.wait()
                held = range(k, min(k + self.unsent, self.tokens))
                break
            await asyncio.sleep(self.step_s)
            last = k == self.tokens - 1
            yield _output([self.first + k], [-0.5 * (k + 1)], finished=last, reason="length")
        else:
            return
        ids, lps = [self.first + k for k in held], [-0.5 * (k + 1) for k in held]
        yield _output(ids, lps, finished=True, reason="abort")

    async def abort(self, sub_ids) -> None:
        for sub_id in [sub_ids] if isinstance(sub_ids, str) else sub_ids:
            self.aborted.append(sub_id)
            self._abort_events.setdefault(sub_id, asyncio.Event()).set()


def _output(ids: list[int], lps: list[float], *, finished: bool, reason: str):
    positions = FlatLogprobs(
        start_indices=list(range(len(ids))),
        end_indices=list(range(1, len(ids) + 1)),
        token_ids=ids,
        logprobs=lps,
        ranks=[1] * len(ids),
        decoded_tokens=[None] * len(ids),
    )
    completion = SimpleNamespace(token_ids=ids, logprobs=positions, finish_reason=reason)
    return SimpleNamespace(
        outputs=[completion], num_cached_tokens=0, finished=finished, kv_transfer_params=None
    )


def _engine(llm: FakeLLM, timeout_s: float = 600.0, load_timeout_s: float = 120.0) -> VLLMEngine:
    config = EngineConfig(
        request_timeout_s=timeout_s,
        weight_load_timeout_s=load_timeout_s,
        kv_transfer=KVTransferConfig(connector="none"),
    )
    return VLLMEngine(llm, vocab_size=1000, max_model_len=256, config=config)


def _request(rid: str, n: int = 1, max_tokens: int = 4) -> GenerateRequest:
    sampling = SamplingParams(max_tokens=max_tokens, n=n, seed=1)
    return GenerateRequest(request_id=rid, prompt_ids=[1, 2, 3], sampling=sampling)


@pytest.mark.parametrize("n", [1, 2])
async def test_each_choice_streams_its_tokens_logprobs_and_finish(n: int) -> None:
    engine = _engine(FakeLLM(tokens=4))
    completions = await collect(engine, _request("r", n=n))
    assert [c.index for c in completions] == list(range(n))
    for c in completions:
        assert c.token_ids == [100, 101, 102, 103]
        assert c.logprobs == [-0.5, -1.0, -1.5, -2.0]
        assert c.versions == [0, 0, 0, 0]
        assert c.finish_reason == "length"
    assert engine.statistics().running_requests == 0
    assert engine.statistics().tokens_generated == 4 * n


@pytest.mark.parametrize("n", [1, 2])
async def test_a_request_past_its_deadline_is_aborted_in_vllm_and_raises(n: int) -> None:
    llm = FakeLLM(tokens=4, stall_after=2)
    engine = _engine(llm, timeout_s=0.2)
    seen: list[int] = []
    with pytest.raises(EngineTimeoutError, match="request_timeout_s=0.2"):
        async for delta in engine.generate(_request("late", n=n)):
            seen += delta.token_ids
    assert sorted(set(llm.aborted)) == [f"late/{i}/0" for i in range(n)]
    assert sorted(seen) == sorted([100, 101] * n)  # what came before the deadline was handed out
    stats = engine.statistics()
    assert stats.running_requests == 0
    assert stats.requests_aborted == n


async def test_the_deadline_holds_for_a_consumer_slower_than_the_engine() -> None:
    # n > 1: each pass hands out every delta queued meanwhile; before, the deadline was only
    # checked when nothing was queued, which a slow consumer never sees: the request ran to
    # max_tokens (400 steps of >= 1 ms, about 0.5 s) past its 0.2 s deadline
    llm = FakeLLM(tokens=400, step_s=0.001)
    engine = _engine(llm, timeout_s=0.2)
    seen = 0
    with pytest.raises(EngineTimeoutError, match="request_timeout_s=0.2"):
        async for delta in engine.generate(_request("slow", n=2, max_tokens=400)):
            seen += len(delta.token_ids)
            await asyncio.sleep(0.03)
    assert 0 < seen < 2 * 400
    assert sorted(set(llm.aborted)) == ["slow/0/0", "slow/1/0"]
    assert engine.statistics().running_requests == 0


async def _abort_after(engine: VLLMEngine, tokens: int) -> tuple[Completion, list[TokenDelta]]:
    """Request "a" (max_tokens 8) consumed in a task of its own, aborted by the caller once
    `tokens` tokens were streamed: the abort's completion and every delta the stream gave."""
    deltas: list[TokenDelta] = []

    async def consume() -> None:
        async for delta in engine.generate(_request("a", max_tokens=8)):
            deltas.append(delta)

    task = asyncio.create_task(consume())
    while sum(len(d.token_ids) for d in deltas) < tokens:
        await asyncio.sleep(0)
    [completion] = await engine.abort("a")
    await task
    return completion, deltas


async def test_abort_mid_stream_returns_exactly_the_tokens_streamed() -> None:
    llm = FakeLLM(tokens=8, stall_after=3)
    completion, deltas = await _abort_after(_engine(llm), 3)
    seen = [t for d in deltas for t in d.token_ids]
    assert completion.token_ids == seen == [100, 101, 102]
    assert completion.finish_reason == "abort"
    assert deltas[-1].finish_reason == "abort"
    assert set(llm.aborted) == {"a/0/0"}


async def test_a_consumer_that_leaves_aborts_the_vllm_request() -> None:
    llm = FakeLLM(tokens=8, stall_after=2)
    engine = _engine(llm)
    stream = engine.generate(_request("gone", max_tokens=8))
    assert (await anext(stream)).token_ids == [100]
    await stream.aclose()
    assert set(llm.aborted) == {"gone/0/0"}  # vLLM's generate aborts a request its consumer left
    assert engine.statistics().running_requests == 0


class PausingLLM(FakeLLM):
    """`FakeLLM` with vLLM's pause as `load_weights` uses it. `pause_generation(mode="abort")`
    aborts the requests the engine has; one that arrives while paused waits for
    `resume_generation` (or an abort); an abort naming a request the engine does not have yet is
    a no-op. `late` holds back the arrival of the first request whose ID starts with `late` until
    the pause has begun: the order in which a request and a pause cross the engine core's socket
    (B32)."""

    def __init__(self, tokens: int, late: str, **fake) -> None:
        super().__init__(tokens, **fake)
        self.late_prefix = late
        self.late = asyncio.Event()
        self.arrived: set[str] = set()
        self.resumed = asyncio.Event()
        self.resumed.set()
        self.rpcs: list[tuple[str, dict]] = []

    async def generate(self, prompt, params, sub_id):
        if sub_id.startswith(self.late_prefix) and not self.arrived:
            await self.late.wait()
        self.arrived.add(sub_id)
        aborted = self._abort_events.setdefault(sub_id, asyncio.Event())
        waits = [asyncio.create_task(e.wait()) for e in (self.resumed, aborted)]
        try:
            await asyncio.wait(waits, return_when="FIRST_COMPLETED")
        finally:
            for wait in waits:
                wait.cancel()
        async for out in super().generate(prompt, params, sub_id):
            yield out

    async def abort(self, sub_ids) -> None:
        ids = [sub_ids] if isinstance(sub_ids, str) else sub_ids
        await super().abort([i for i in ids if i in self.arrived])

    async def pause_generation(self, *, mode: str, clear_cache: bool) -> None:
        assert mode == "abort"
        self.resumed.clear()
        await super().abort(sorted(self.arrived))
        self.late.set()  # the held-back request reaches the engine now, paused

    async def resume_generation(self) -> None:
        self.resumed.set()

    async def collective_rpc(self, method: str, kwargs: dict) -> None:
        self.rpcs.append((method, kwargs))

    async def reset_prefix_cache(self) -> bool:
        return True


async def test_a_request_that_reaches_vllm_after_a_loads_pause_continues_after_it() -> None:
    # B32: before, the load waited for this request to end, and it waited for the load's resume:
    # nothing happened until weight_load_timeout_s, then the run stopped on a WeightSyncError
    llm = PausingLLM(tokens=4, late="r/0/0")
    engine = _engine(llm, load_timeout_s=5.0)
    consumer = asyncio.create_task(collect(engine, _request("r", max_tokens=4)))
    while "r/0/0" not in engine._active_subs:
        await asyncio.sleep(0)
    await engine.load_weights("snapshot-1", 1)
    [completion] = await consumer
    assert llm.rpcs == [("reload_weights", {"weights_path": "snapshot-1"})]
    assert "r/0/0" in llm.aborted and "r/0/1" in llm.arrived
    # the aborted attempt had produced nothing; the continuation's tokens are version 1's
    assert completion.token_ids == [100, 101, 102, 103]
    assert completion.versions == [1, 1, 1, 1]
    assert completion.finish_reason == "length"
    assert engine.weight_version == 1


async def test_tokens_vllm_had_not_handed_over_at_an_abort() -> None:
    """With `stream_interval` > 1 vLLM's final abort output carries tokens it sampled but had not
    handed over. The caller's abort (`/abort`, a redirect, a deadline) returns what the stream
    carried and drops them; a weight load keeps them at the version that sampled them and
    continues after them."""
    aborted, deltas = await _abort_after(_engine(FakeLLM(tokens=4, stall_after=2, unsent=2)), 2)
    seen = [t for d in deltas for t in d.token_ids]
    assert aborted.token_ids == seen == [100, 101] and aborted.finish_reason == "abort"

    llm = PausingLLM(tokens=4, late="none", stall_after=2, unsent=2)
    engine = _engine(llm, load_timeout_s=5.0)
    consumer = asyncio.create_task(collect(engine, _request("w", max_tokens=8)))
    while engine.statistics().tokens_generated < 2:
        await asyncio.sleep(0)
    await engine.load_weights("snapshot-1", 1)
    [completion] = await consumer
    assert completion.token_ids == [100, 101, 102, 103, 100, 101, 102, 103]  # 2nd attempt: 100..
    assert completion.versions == [0, 0, 0, 0, 1, 1, 1, 1]
    assert completion.logprobs == [-0.5, -1.0, -1.5, -2.0] * 2
    assert completion.finish_reason == "length"


async def test_an_export_request_a_load_aborts_is_refused_not_awaited() -> None:
    llm = PausingLLM(tokens=1, late="gyre-export-")
    engine = _engine(llm, load_timeout_s=5.0)
    export = asyncio.create_task(engine.run_export_request([1, 2, 3], {}))
    while not engine._active_subs:
        await asyncio.sleep(0)
    [rid] = engine._active_subs
    await engine.load_weights("snapshot-1", 1)
    with pytest.raises(EngineUnavailableError, match=f"weight load aborted request {rid}"):
        await export
    assert rid in llm.aborted and llm.rpcs == [("reload_weights", {"weights_path": "snapshot-1"})]
    assert engine.weight_version == 1


def test_deltas_of_one_choice_merge_in_order_and_not_past_a_finish() -> None:
    first = TokenDelta(
        index=1,
        token_ids=[5],
        logprobs=[-0.1],
        versions=[2],
        top_ids=[[5, 6]],
        top_logprobs=[[-0.1, -2.3]],
    )
    last = TokenDelta(
        index=1,
        token_ids=[7],
        logprobs=[-0.4],
        versions=[3],
        finish_reason="stop",
        cached_tokens=9,
        top_ids=[[7, 5]],
        top_logprobs=[[-0.4, -1.2]],
    )
    merged = first.then(last)
    assert (merged.index, merged.token_ids, merged.logprobs, merged.versions) == (
        1,
        [5, 7],
        [-0.1, -0.4],
        [2, 3],
    )
    assert (merged.finish_reason, merged.cached_tokens) == ("stop", 9)
    assert merged.top_ids == [[5, 6], [7, 5]]
    assert merged.top_logprobs == [[-0.1, -2.3], [-0.4, -1.2]]
    with pytest.raises(ValueError, match="choice 1 cannot follow"):
        merged.then(last)  # nothing follows a finish
    with pytest.raises(ValueError, match="choice 0 cannot follow"):
        first.then(TokenDelta(index=0, token_ids=[], logprobs=[], versions=[]))


async def test_a_plain_proxy_call_cut_at_a_stop_string_returns_at_once() -> None:
    """The proxy's non-streamed path reads VLLMEngine in its own task (`run_to_end`), the task
    that also drives a one-choice request: the stream is closed before the abort, which would
    otherwise wait `request_timeout_s` for that task and fail the call with a 500."""
    import httpx

    from gyre.model.recipe import build_tokenizer
    from tests.tito.conftest import make_proxy, serving

    tok = build_tokenizer()
    a = tok.convert_tokens_to_ids("a")  # the byte-level vocabulary: "a", "b", "c", ... in a row
    llm = FakeLLM(tokens=8, step_s=0.01, first=a)
    proxy = make_proxy(tok, _engine(llm, timeout_s=3.0))
    key = proxy.mint_key("stop")
    body = {"model": "gyre", "prompt": "go", "max_tokens": 8, "stop": ["cd"]}
    async with serving(proxy) as base, httpx.AsyncClient(base_url=base, timeout=30) as http:
        r = await http.post("/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["text"] == "ab"
    (call,) = proxy.calls("stop", full=True)
    assert call.completion_ids == [a, a + 1, a + 2, a + 3]  # up to the token that completed it
    assert len(llm.aborted) == 1  # and vLLM's request was stopped there
