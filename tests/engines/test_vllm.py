"""The real vLLM engine behind gyre's protocol, through a cell process and its client.

Behaviour logprobs are checked against an independent recompute with transformers on the same
weights (fp32); field case B05, B07, B12, B20 and B22 are asserted with their stated values.
One vLLM cell is shared by the session (`vllm_cell`); the B05 test starts its own 3-token model.
"""

from __future__ import annotations

import math

import anyio
import pytest
import torch

from gyre.config import EngineConfig
from gyre.engines import GenerateRequest, SamplingParams, collect
from gyre.errors import ContextLengthError, EngineUnavailableError, InvalidRequestError
from gyre.model.behaviour_logprobs import completion_logprobs
from tests.conftest import VLLM_MAX_MODEL_LEN, start_vllm_cell

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

FP32_TOL = 1e-5


@pytest.fixture
def anyio_backend() -> str:
    return "trio"  # the node's backend; one backend keeps the real-engine tier short


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def model_a(tiny_model_dir):
    return _load(tiny_model_dir)


@pytest.fixture(scope="module")
def model_b(tiny_model_b_dir):
    return _load(tiny_model_b_dir)


def prompt(tokenizer, text: str) -> list[int]:
    msgs = [{"role": "user", "content": text}]
    rendered = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(rendered, add_special_tokens=False)


def req(rid: str, ids: list[int], **sampling) -> GenerateRequest:
    return GenerateRequest(request_id=rid, prompt_ids=ids, sampling=SamplingParams(**sampling))


def max_abs_diff(model, prompt_ids, c, **sampling) -> float:
    ref = completion_logprobs(model, prompt_ids, c.token_ids, **sampling)
    return (ref - torch.tensor(c.logprobs, dtype=ref.dtype)).abs().max().item()


async def test_logprobs_match_transformers_single(vllm_engine, tokenizer, model_a) -> None:
    ids = prompt(tokenizer, "write the word blue to out.txt")
    [c] = await collect(vllm_engine, req("single", ids, max_tokens=48, temperature=1.0, seed=3))
    assert len(c.token_ids) == len(c.logprobs) == 48
    assert max_abs_diff(model_a, ids, c) <= FP32_TOL


async def test_b07_logprobs_match_transformers_8_concurrent(
    vllm_engine, tokenizer, model_a
) -> None:
    prompts = [prompt(tokenizer, "count " + "x " * (5 + 37 * i)) for i in range(8)]
    results: dict[int, list] = {}
    async with anyio.create_task_group() as tg:
        for i, ids in enumerate(prompts):

            async def one(i=i, ids=ids) -> None:
                results[i] = await collect(
                    vllm_engine, req(f"conc-{i}", ids, max_tokens=40, seed=i)
                )

            tg.start_soon(one)
    worst = max(max_abs_diff(model_a, prompts[i], results[i][0]) for i in range(8))
    assert worst <= FP32_TOL


async def test_b07_request_joining_mid_batch(vllm_engine, tokenizer, model_a) -> None:
    early = [prompt(tokenizer, f"list files in dir {i}") for i in range(3)]
    late = prompt(tokenizer, "a request that joins a running batch")
    results: dict[str, list] = {}
    seen = [0]
    async with anyio.create_task_group() as tg:
        for i, ids in enumerate(early):

            async def long(i=i, ids=ids) -> None:
                out = []
                async for d in vllm_engine.generate(req(f"early-{i}", ids, max_tokens=400, seed=i)):
                    out.append(d)
                    seen[0] += len(d.token_ids)
                results[f"early-{i}"] = out

            tg.start_soon(long)
        while seen[0] < 30:
            await anyio.sleep(0.01)
        seen_when_late_starts = seen[0]
        results["late"] = await collect(vllm_engine, req("late", late, max_tokens=40, seed=9))
        seen_when_late_done = seen[0]
    assert max_abs_diff(model_a, late, results["late"][0]) <= FP32_TOL
    for i, ids in enumerate(early):
        deltas = results[f"early-{i}"]
        token_ids = [t for d in deltas for t in d.token_ids]
        lps = torch.tensor([x for d in deltas for x in d.logprobs], dtype=torch.float32)
        ref = completion_logprobs(model_a, ids, token_ids)
        assert (ref - lps).abs().max().item() <= FP32_TOL
    # the late request ran inside the early ones' batch: it ended while they still streamed
    assert seen_when_late_done < 1200, (seen_when_late_starts, seen_when_late_done)


async def test_b05_importance_ratio_at_temperature_07(vllm_engine, tokenizer, model_a) -> None:
    ids = prompt(tokenizer, "tell a long story")
    [c] = await collect(vllm_engine, req("t07", ids, max_tokens=200, temperature=0.7, seed=11))
    assert len(c.token_ids) == 200
    ref = completion_logprobs(model_a, ids, c.token_ids, temperature=0.7)
    ratio = torch.exp(torch.tensor(c.logprobs, dtype=torch.float64) - ref.double())
    assert 0.98 <= ratio.mean().item() <= 1.02
    raw = completion_logprobs(model_a, ids, c.token_ids, temperature=1.0)
    assert (raw - ref).abs().max().item() > 1e-2  # the check can tell tempered from raw logprobs


async def test_top_k_top_p_logprobs_are_those_sampled_from(vllm_engine, tokenizer, model_a) -> None:
    ids = prompt(tokenizer, "pick a file name")
    sampling = dict(temperature=0.8, top_k=50, top_p=0.9)
    [c] = await collect(vllm_engine, req("topkp", ids, max_tokens=32, seed=5, **sampling))
    assert max_abs_diff(model_a, ids, c, **sampling) <= FP32_TOL


async def greedy(engine, rid, ids, n_tokens):
    [c] = await collect(engine, req(rid, ids, max_tokens=n_tokens, temperature=0.0))
    return c


async def test_stop_token_kept_with_logprob(vllm_engine, tokenizer) -> None:
    ids = prompt(tokenizer, "stop test")
    free = await greedy(vllm_engine, "free", ids, 12)
    k = next(i for i in range(2, 12) if free.token_ids[i] not in free.token_ids[:i])
    [c] = await collect(
        vllm_engine,
        req("stop", ids, max_tokens=12, temperature=0.0, stop_token_ids=(free.token_ids[k],)),
    )
    assert c.finish_reason == "stop"
    assert c.token_ids == free.token_ids[: k + 1]
    assert c.logprobs == pytest.approx(free.logprobs[: k + 1], abs=FP32_TOL)


async def test_max_tokens_is_length_with_nothing_appended(vllm_engine, tokenizer) -> None:
    c = await greedy(vllm_engine, "len", prompt(tokenizer, "length test"), 5)
    assert (len(c.token_ids), len(c.logprobs), c.finish_reason) == (5, 5, "length")


async def test_b20_lone_eos_completion_is_one_token(vllm_engine, tokenizer) -> None:
    ids = prompt(tokenizer, "eos test")
    first = (await greedy(vllm_engine, "eos-probe", ids, 1)).token_ids[0]
    [c] = await collect(
        vllm_engine, req("eos", ids, max_tokens=10, temperature=0.0, stop_token_ids=(first,))
    )
    assert (c.token_ids, c.finish_reason, len(c.logprobs)) == ([first], "stop", 1)


async def test_b20_abort_before_first_token_is_zero_tokens(vllm_engine, tokenizer) -> None:
    assert await vllm_engine.abort("early-abort") == []
    [c] = await collect(
        vllm_engine, req("early-abort", prompt(tokenizer, "never runs"), max_tokens=50)
    )
    assert (c.token_ids, c.logprobs, c.finish_reason) == ([], [], "abort")


async def test_abort_mid_stream_returns_the_streamed_tokens(vllm_engine, tokenizer) -> None:
    mid_stream = 0
    for attempt in range(3):  # on a loaded machine the request may end before the abort lands
        rid = f"mid-abort-{attempt}"
        streamed: list[int] = []
        finish = []
        async with anyio.create_task_group() as tg:

            async def consume() -> None:
                async for d in vllm_engine.generate(
                    req(rid, prompt(tokenizer, "go on"), max_tokens=1500, seed=1)  # noqa: B023 the task group ends within this attempt
                ):
                    streamed.extend(d.token_ids)  # noqa: B023 the task group ends within this attempt
                    if d.finish_reason:
                        finish.append(d.finish_reason)  # noqa: B023 the task group ends within this attempt

            tg.start_soon(consume)
            while len(streamed) < 5:
                await anyio.sleep(0.005)
            aborted = await vllm_engine.abort(rid)
        if not aborted:  # it had finished: the stream carried everything, ending with `length`
            assert (finish, len(streamed)) == (["length"], 1500)
            continue
        [choice] = aborted
        assert finish == ["abort"] and choice.finish_reason == "abort"
        assert choice.token_ids == streamed and 5 <= len(streamed) < 1500
        mid_stream += 1
        break
    assert (
        mid_stream == 1
    )  # streams reach the client as they are sampled, so the abort lands mid-stream


async def test_tokens_reach_the_client_in_stream_interval_chunks(vllm_engine, tokenizer) -> None:
    """vLLM hands a request's tokens over every `stream_interval` tokens (the first and the last
    at once); the cell's stream may merge chunks but never splits one. So every count of tokens
    received so far is 1 + a multiple of the interval, or the whole completion. With an interval
    of 1 the ~25 boundaries of 200 tokens would land anywhere."""
    every = vllm_engine.config.stream_interval
    assert every == EngineConfig().stream_interval == 4  # the shared cell runs the default
    received, counts = 0, []
    async for d in vllm_engine.generate(req("chunks", prompt(tokenizer, "count"), max_tokens=200)):
        received += len(d.token_ids)
        if d.token_ids:
            counts.append(received)
    assert counts[-1] == 200 and len(counts) >= 3
    assert [n for n in counts[:-1] if (n - 1) % every] == []


async def test_b22_n4_seed7_distinct_and_repeatable(vllm_engine, tokenizer) -> None:
    ids = prompt(tokenizer, "name a random 4-digit number")
    first = await collect(
        vllm_engine, req("n4-a", ids, n=4, seed=7, temperature=1.0, max_tokens=12)
    )
    again = await collect(
        vllm_engine, req("n4-b", ids, n=4, seed=7, temperature=1.0, max_tokens=12)
    )
    assert [c.index for c in first] == [0, 1, 2, 3]
    assert len({tuple(c.token_ids) for c in first}) == 4
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert [c.logprobs for c in first] == [c.logprobs for c in again]


async def test_weight_load_mid_generation_versions_tokens(
    vllm_engine, tokenizer, tiny_model_dir, tiny_model_b_dir, model_a, model_b
) -> None:
    ids = prompt(tokenizer, "a long generation across a weight load")
    v0 = (await vllm_engine.refresh_statistics()).weight_version
    deltas = []
    async with anyio.create_task_group() as tg:

        async def consume() -> None:
            async for d in vllm_engine.generate(req("across-load", ids, max_tokens=1200, seed=2)):
                deltas.append(d)

        tg.start_soon(consume)
        while sum(len(d.token_ids) for d in deltas) < 10:
            await anyio.sleep(0.005)
        await vllm_engine.load_weights(str(tiny_model_b_dir), v0 + 1)
    try:
        tokens = [t for d in deltas for t in d.token_ids]
        versions = [v for d in deltas for v in d.versions]
        lps = [x for d in deltas for x in d.logprobs]
        assert deltas[-1].finish_reason == "length" and len(tokens) == 1200  # nothing dropped
        assert v0 + 1 in versions, "the request finished before the weight load landed"
        k = versions.index(v0 + 1)
        assert versions == [v0] * k + [v0 + 1] * (1200 - k) and 10 <= k < 1200
        ref_a = completion_logprobs(model_a, ids, tokens[:k])
        ref_b = completion_logprobs(model_b, ids + tokens[:k], tokens[k:])
        assert (ref_a - torch.tensor(lps[:k])).abs().max().item() <= FP32_TOL
        assert (ref_b - torch.tensor(lps[k:])).abs().max().item() <= FP32_TOL
    finally:
        await vllm_engine.load_weights(str(tiny_model_dir), v0 + 2)


async def test_b12_prefix_cache_not_reused_after_weight_load(
    vllm_engine, tokenizer, tiny_model_dir, tiny_model_b_dir, model_b
) -> None:
    ids = prompt(tokenizer, "prefix cache " * 40)
    assert len(ids) >= 4 * 32  # at least 4 KV blocks of 32 tokens
    v0 = (await vllm_engine.refresh_statistics()).weight_version
    await collect(vllm_engine, req("b12-1", ids, max_tokens=16, temperature=0.0))
    [hit] = await collect(vllm_engine, req("b12-2", ids, max_tokens=16, temperature=0.0))
    deltas = [
        d async for d in vllm_engine.generate(req("b12-2b", ids, max_tokens=16, temperature=0.0))
    ]
    assert deltas[-1].cached_tokens >= 4 * 32  # the prefix cache is on and hit before the load
    await vllm_engine.load_weights(str(tiny_model_b_dir), v0 + 1)
    try:
        deltas = [
            d async for d in vllm_engine.generate(req("b12-3", ids, max_tokens=16, temperature=0.0))
        ]
        warm = [t for d in deltas for t in d.token_ids]
        assert deltas[-1].cached_tokens == 0
        cold = model_b.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)[
            0, len(ids) :
        ].tolist()
        assert warm == cold
        assert warm != hit.token_ids  # the two checkpoints are visibly different
        lps = torch.tensor([x for d in deltas for x in d.logprobs])
        assert (completion_logprobs(model_b, ids, warm) - lps).abs().max().item() <= FP32_TOL
        assert (await vllm_engine.refresh_statistics()).prefix_cache_resets >= 1
    finally:
        await vllm_engine.load_weights(str(tiny_model_dir), v0 + 2)


@pytest.mark.parametrize(
    ("ids", "sampling", "error", "named"),
    [
        ([5] * VLLM_MAX_MODEL_LEN, {}, ContextLengthError, f"{VLLM_MAX_MODEL_LEN} tokens"),
        ([], {}, InvalidRequestError, "prompt_ids is empty"),
        ([5, 6, 100000], {}, InvalidRequestError, "100000"),
        ([5, 6, 7], {"max_tokens": -1}, InvalidRequestError, "max_tokens=-1"),
    ],
)
async def test_bad_input_typed_error_and_engine_keeps_serving(
    vllm_engine, ids, sampling, error, named
) -> None:
    with pytest.raises(error, match=named):
        await collect(vllm_engine, req("bad", ids, **sampling))
    [c] = await collect(vllm_engine, req("after-bad", [5, 6, 7], max_tokens=4))
    assert len(c.token_ids) == 4


async def test_pause_refuses_then_resume_serves(vllm_engine) -> None:
    await vllm_engine.pause()
    try:
        with pytest.raises(EngineUnavailableError, match="paused"):
            await collect(vllm_engine, req("paused", [5, 6, 7], max_tokens=4))
    finally:
        await vllm_engine.resume()
    [c] = await collect(vllm_engine, req("resumed", [5, 6, 7], max_tokens=4))
    assert len(c.token_ids) == 4


# -- B05 exactly: a 3-token model whose head yields logits [2, 1, 0] for every input ----------


def write_b05_model(path) -> None:
    """A Qwen2 whose blocks add nothing and whose head maps every state to logits [2, 1, 0]."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hidden = 128
    config = Qwen2Config(
        vocab_size=3,
        hidden_size=hidden,
        intermediate_size=256,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-12,
        tie_word_embeddings=False,
        max_position_embeddings=256,
        eos_token_id=None,
        bos_token_id=None,
    )
    model = Qwen2ForCausalLM(config).float()
    with torch.no_grad():
        model.model.embed_tokens.weight.fill_(1.0)  # every token -> ones; RMSNorm keeps ones
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        model.lm_head.weight.copy_(torch.tensor([[2.0], [1.0], [0.0]]).expand(3, hidden) / hidden)
    model.save_pretrained(path)


async def test_b05_behaviour_logprob_is_after_temperature(tmp_path) -> None:
    write_b05_model(tmp_path / "b05")
    process, cell = start_vllm_cell(tmp_path / "b05", tmp_path / "b05.log", max_model_len=64)
    try:
        from gyre.cell.client import CellClient

        async with CellClient(cell.url, cell.config) as engine:
            [c] = await collect(
                engine, req("b05", [1, 2], n=1, max_tokens=40, temperature=0.5, seed=0)
            )
    finally:
        process.stop()
    expected = math.log(math.exp(4) / (math.exp(4) + math.exp(2) + 1))  # log softmax([4, 2, 0])[0]
    assert expected == pytest.approx(-0.14293, abs=1e-5)
    zeros = [lp for t, lp in zip(c.token_ids, c.logprobs) if t == 0]
    assert len(zeros) >= 20  # p(token 0) = 0.867 at T = 0.5
    for lp in zeros:
        assert lp == pytest.approx(-0.14293, abs=1e-4)
        assert lp != pytest.approx(-0.40761, abs=1e-3) and lp != pytest.approx(-0.81521, abs=1e-3)


@pytest.mark.slow
async def test_a_seeded_prompt_longer_than_a_prefill_chunk_does_not_kill_the_cpu_engine(
    tiny_model_dir, tokenizer, tmp_path
) -> None:
    """vLLM's CPU backend: a seeded request whose prompt spans two prefill chunks (vLLM's
    default chunk is 2,048 tokens) made the engine rewind a CPU random generator and die. The
    engine now prefills any prompt in one chunk: the same seed gives the same tokens twice, and
    an unseeded request still works after."""
    from gyre.cell.client import CellClient

    process, cell = start_vllm_cell(tiny_model_dir, tmp_path / "cell.log", max_model_len=8192)
    try:
        async with CellClient(cell.url, cell.config) as engine:
            ids = prompt(tokenizer, "word " * 3000)
            assert len(ids) > 2048
            runs = [
                await collect(engine, req(f"seeded-{i}", ids, max_tokens=8, seed=7))
                for i in range(2)
            ]
            assert runs[0][0].token_ids == runs[1][0].token_ids and len(runs[0][0].token_ids) == 8
            [c] = await collect(engine, req("unseeded", ids[:100], max_tokens=4))
            assert len(c.token_ids) == 4
    finally:
        process.stop()
