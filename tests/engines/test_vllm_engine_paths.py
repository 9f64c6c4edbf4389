"""`VLLMEngine`'s request paths over a scripted stand-in for vLLM's `AsyncLLM`: a one-choice
request driven in its consumer's task, several choices each in a task of their own, the request
deadline on both, and an abort mid-stream. The real engine is `test_vllm.py`'s (slow tier)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from gyre.config import EngineConfig, KVTransferConfig
from gyre.engines import GenerateRequest, SamplingParams, collect
from gyre.engines.vllm_engine import VLLMEngine
from gyre.errors import EngineTimeoutError

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the cell's loop: VLLMEngine is asyncio-only


class FakeLLM:
    """`AsyncLLM.generate`/`abort` as gyre uses them: DELTA outputs of one token each, token k of
    a sub-request being `100 + k` with logprob `-0.5 * (k + 1)`; after `stall_after` tokens it
    waits until aborted, then ends with finish reason "abort" (what vLLM does); a consumer that
    leaves aborts it too."""

    def __init__(self, tokens: int, stall_after: int | None = None) -> None:
        self.tokens = tokens
        self.stall_after = stall_after
        self.aborted: list[str] = []
        self._abort_events: dict[str, asyncio.Event] = {}

    async def generate(self, prompt, params, sub_id):
        try:
            async for out in self._outputs(sub_id):
                yield out
        except (GeneratorExit, asyncio.CancelledError):
            self.aborted.append(sub_id)  # vLLM aborts a request whose consumer left
            raise

    async def _outputs(self, sub_id):
        aborted = self._abort_events.setdefault(sub_id, asyncio.Event())
        for k in range(self.tokens):
            if aborted.is_set():
                break
            if self.stall_after is not None and k == self.stall_after:
                await aborted.wait()
                break
            await asyncio.sleep(0)
            last = k == self.tokens - 1
            yield _output([100 + k], [-0.5 * (k + 1)], finished=last, reason="length")
        else:
            return
        yield _output([], [], finished=True, reason="abort")

    async def abort(self, sub_ids) -> None:
        for sub_id in [sub_ids] if isinstance(sub_ids, str) else sub_ids:
            self.aborted.append(sub_id)
            self._abort_events.setdefault(sub_id, asyncio.Event()).set()


def _output(ids: list[int], lps: list[float], *, finished: bool, reason: str):
    positions = [{tok: SimpleNamespace(logprob=lp, rank=1)} for tok, lp in zip(ids, lps)]
    completion = SimpleNamespace(token_ids=ids, logprobs=positions, finish_reason=reason)
    return SimpleNamespace(outputs=[completion], num_cached_tokens=0, finished=finished)


def _engine(llm: FakeLLM, timeout_s: float = 600.0) -> VLLMEngine:
    config = EngineConfig(
        request_timeout_s=timeout_s, kv_transfer=KVTransferConfig(connector="none")
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


async def test_abort_mid_stream_returns_exactly_the_tokens_streamed() -> None:
    llm = FakeLLM(tokens=8, stall_after=3)
    engine = _engine(llm)
    seen: list[int] = []
    finish = []

    async def consume() -> None:
        async for delta in engine.generate(_request("a", max_tokens=8)):
            seen.extend(delta.token_ids)
            finish.append(delta.finish_reason)

    task = asyncio.create_task(consume())
    while len(seen) < 3:
        await asyncio.sleep(0)
    [completion] = await engine.abort("a")
    await task
    assert completion.token_ids == seen == [100, 101, 102]
    assert completion.finish_reason == "abort"
    assert finish[-1] == "abort"
    assert set(llm.aborted) == {"a/0/0"}


async def test_a_consumer_that_leaves_aborts_the_vllm_request() -> None:
    llm = FakeLLM(tokens=8, stall_after=2)
    engine = _engine(llm)
    stream = engine.generate(_request("gone", max_tokens=8))
    assert (await anext(stream)).token_ids == [100]
    await stream.aclose()
    assert set(llm.aborted) == {"gone/0/0"}  # vLLM's generate aborts a request its consumer left
    assert engine.statistics().running_requests == 0
