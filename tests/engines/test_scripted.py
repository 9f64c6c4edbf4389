"""The scripted engine honours the engine protocol's rules (it stands in for vLLM above the
engine)."""

from __future__ import annotations

import anyio
import pytest

from gyre.engines import Completion, GenerateRequest, InferenceEngine, SamplingParams, collect
from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from gyre.errors import ContextLengthError, EngineUnavailableError, InvalidRequestError

pytestmark = pytest.mark.anyio

EOS = 2


def req(rid: str = "r", prompt=(5, 6, 7), **sampling) -> GenerateRequest:
    return GenerateRequest(
        request_id=rid, prompt_ids=list(prompt), sampling=SamplingParams(**sampling)
    )


def test_scripted_engine_implements_protocol() -> None:
    assert isinstance(ScriptedEngine(), InferenceEngine)


async def test_stop_token_is_kept_with_its_logprob() -> None:
    engine = ScriptedEngine(
        [ScriptedReply(token_ids=[10, 11, EOS, 12], logprobs=[-1.0, -2.0, -3.0, -4.0])]
    )
    [c] = await collect(engine, req(stop_token_ids=(EOS,)))
    assert c == Completion(
        index=0,
        token_ids=[10, 11, EOS],
        logprobs=[-1.0, -2.0, -3.0],
        versions=[0, 0, 0],
        finish_reason="stop",
    )


async def test_max_tokens_gives_length_with_nothing_appended() -> None:
    engine = ScriptedEngine([ScriptedReply(token_ids=[10, 11, 12, 13, EOS])])
    [c] = await collect(engine, req(max_tokens=3, stop_token_ids=(EOS,)))
    assert (c.token_ids, c.finish_reason) == ([10, 11, 12], "length")


async def test_lone_eos_is_one_token() -> None:
    engine = ScriptedEngine([ScriptedReply(token_ids=[EOS])])
    [c] = await collect(engine, req(stop_token_ids=(EOS,)))
    assert (c.token_ids, len(c.logprobs), c.finish_reason) == ([EOS], 1, "stop")


async def test_context_limit_clamps_max_tokens() -> None:
    engine = ScriptedEngine([ScriptedReply(token_ids=list(range(10, 30)))], max_model_len=8)
    [c] = await collect(engine, req(prompt=[5, 6, 7], max_tokens=100))
    assert (len(c.token_ids), c.finish_reason) == (5, "length")


async def test_abort_before_arrival_gives_zero_tokens() -> None:
    engine = ScriptedEngine()
    assert await engine.abort("r") == []
    [c] = await collect(engine, req())
    assert (c.token_ids, c.logprobs, c.finish_reason) == ([], [], "abort")


async def test_abort_mid_stream_returns_exactly_the_tokens_streamed() -> None:
    engine = ScriptedEngine([ScriptedReply(token_ids=list(range(10, 40)))], token_delay_s=0.01)
    streamed: list[int] = []
    finish = None
    async with anyio.create_task_group() as tg:

        async def consume() -> None:
            nonlocal finish
            async for d in engine.generate(req(max_tokens=30)):
                streamed.extend(d.token_ids)
                finish = d.finish_reason or finish

        tg.start_soon(consume)
        while len(streamed) < 3:
            await anyio.sleep(0.005)
        [aborted] = await engine.abort("r")
    assert finish == "abort"
    assert aborted.token_ids == streamed and 3 <= len(streamed) < 30
    assert aborted.finish_reason == "abort"


async def test_n4_seeded_choices_differ_and_repeat() -> None:
    engine = ScriptedEngine()
    first = await collect(engine, req(n=4, seed=7, max_tokens=16))
    again = await collect(engine, req(n=4, seed=7, max_tokens=16))
    assert len({tuple(c.token_ids) for c in first}) == 4
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert [c.index for c in first] == [0, 1, 2, 3]


async def test_weight_version_changes_mid_stream() -> None:
    engine = ScriptedEngine([ScriptedReply(token_ids=list(range(10, 20)))], token_delay_s=0.01)
    versions: list[int] = []
    async with anyio.create_task_group() as tg:

        async def consume() -> None:
            async for d in engine.generate(req(max_tokens=10)):
                versions.extend(d.versions)

        tg.start_soon(consume)
        while len(versions) < 4:
            await anyio.sleep(0.005)
        await engine.load_weights("unused", 1)
    k = versions.index(1)
    assert versions == [0] * k + [1] * (10 - k) and 4 <= k < 10


@pytest.mark.parametrize(
    ("request_", "error", "named"),
    [
        (req(prompt=[]), InvalidRequestError, "prompt_ids is empty"),
        (req(prompt=[5, 5000]), InvalidRequestError, "5000"),
        (req(prompt=[5, -1]), InvalidRequestError, "-1"),
        (req(max_tokens=-3), InvalidRequestError, "max_tokens=-3"),
        (req(n=0), InvalidRequestError, "n=0"),
        (req(top_p=0.0), InvalidRequestError, "top_p=0.0"),
        (req(prompt=[5] * 4096), ContextLengthError, "4096 tokens"),
    ],
)
async def test_bad_input_raises_typed_error_and_engine_keeps_serving(
    request_, error, named
) -> None:
    engine = ScriptedEngine(vocab_size=1024, max_model_len=4096)
    with pytest.raises(error, match=named):
        await collect(engine, request_)
    [c] = await collect(engine, req(rid="next"))
    assert c.finish_reason in ("stop", "length") and c.token_ids


async def test_paused_engine_refuses_new_requests() -> None:
    engine = ScriptedEngine()
    await engine.pause()
    with pytest.raises(EngineUnavailableError, match="paused"):
        await collect(engine, req())
    await engine.resume()
    assert (await collect(engine, req()))[0].token_ids
