"""Engine overhead: tokens/s through gyre's engine protocol (cell process + client) vs vLLM direct.

Both run in the same process run, one after the other (an idle engine beside the measured one
slows it down several times on 2 cores): vLLM's AsyncLLM called in-process
(`generate` with token prompts, DELTA outputs, sampled-token logprobs: what gyre asks of it) and
gyre's `CellClient` -> cell (aiohttp, msgpack frames) -> `VLLMEngine` -> its own AsyncLLM, on the
same tiny model and sampling. Every request decodes exactly `max_tokens` tokens (no stop IDs).

Writes benchmarks/results/engine.json: tokens/s per concurrency (1, 8, 32) for both paths and
`overhead_ratio_8`, `overhead_ratio_32` = gyre time / direct time (medians). Goal: <= 1.10.

Run: .venv/bin/python -m benchmarks.bench_engine [--repeats 5] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import anyio

from benchmarks.common import print_table, summarize, write_result
from gyre.config import EngineConfig, ModelConfig
from gyre.engines import GenerateRequest, SamplingParams, collect

CONCURRENCY = (1, 8, 32)


async def _direct(llm, prompts: list[list[int]], max_tokens: int, tag: str) -> int:
    from vllm import SamplingParams as VSamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    params = VSamplingParams(
        max_tokens=max_tokens, temperature=1.0, seed=0, ignore_eos=True, logprobs=0,
        detokenize=False, output_kind=RequestOutputKind.DELTA,
    )
    total = 0

    async def one(i: int, ids: list[int]) -> None:
        nonlocal total
        async for out in llm.generate(TokensPrompt(prompt_token_ids=ids), params, f"{tag}-{i}"):
            c = out.outputs[0]
            total += len([c.logprobs[j][t].logprob for j, t in enumerate(c.token_ids)])

    async with anyio.create_task_group() as tg:
        for i, ids in enumerate(prompts):
            tg.start_soon(one, i, ids)
    return total


async def _gyre(engine, prompts: list[list[int]], max_tokens: int, tag: str) -> int:
    total = 0

    async def one(i: int, ids: list[int]) -> None:
        nonlocal total
        sampling = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=0)
        [c] = await collect(engine, GenerateRequest(request_id=f"{tag}-{i}", prompt_ids=ids, sampling=sampling))
        total += len(c.token_ids)

    async with anyio.create_task_group() as tg:
        for i, ids in enumerate(prompts):
            tg.start_soon(one, i, ids)
    return total


async def _measure(run, prompts, repeats: int, max_tokens: int, out: dict[int, list[float]], tag: str) -> None:
    """Warm `run` at every concurrency, then time `repeats` batches at each into `out[n]` (seconds)."""
    for n in CONCURRENCY:
        await run(prompts[:n], f"warm-{tag}{n}")
    for n in CONCURRENCY:
        for r in range(repeats):
            t0 = time.perf_counter()
            tokens = await run(prompts[:n], f"{tag}{n}-{r}")
            out[n].append(time.perf_counter() - t0)
            assert tokens == n * max_tokens, tokens


async def main_async(repeats: int, max_tokens: int) -> None:
    from vllm.v1.engine.async_llm import AsyncLLM

    from gyre.engines.vllm_engine import engine_args
    from gyre.model import init_model_dir
    from gyre.runtime.cell_client import open_cell

    root = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    model_config = ModelConfig(seed=0)
    model_dir = init_model_dir(root / "model", model_config)
    config = EngineConfig(max_model_len=1024)
    prompts = [[5 + (7 * i + j) % 500 for j in range(32 + 8 * (i % 4))] for i in range(max(CONCURRENCY))]
    direct_s: dict[int, list[float]] = {n: [] for n in CONCURRENCY}
    gyre_s: dict[int, list[float]] = {n: [] for n in CONCURRENCY}
    # One engine at a time: an idle vLLM engine beside the measured one took 2-7x off the measured
    # path on 2 cores (measured 2026-12-01: gyre 55 tok/s at concurrency 1 with the direct engine
    # alive, 344 tok/s alone), which no alternation cancels.
    llm = AsyncLLM.from_engine_args(engine_args(str(model_dir), config))
    try:
        await _measure(lambda ps, tag: _direct(llm, ps, max_tokens, tag), prompts, repeats, max_tokens, direct_s, "d")
    finally:
        llm.shutdown()
    async with open_cell(model_dir, config, log_path=root / "cell.log") as engine:
        await _measure(lambda ps, tag: _gyre(engine, ps, max_tokens, tag), prompts, repeats, max_tokens, gyre_s, "g")
    rows, numbers = [], {}
    for n in CONCURRENCY:
        d, g = summarize(direct_s[n]), summarize(gyre_s[n])
        numbers[f"direct_s_{n}"] = d
        numbers[f"gyre_s_{n}"] = g
        numbers[f"direct_tokens_per_s_{n}"] = n * max_tokens / d["median"]
        numbers[f"gyre_tokens_per_s_{n}"] = n * max_tokens / g["median"]
        numbers[f"overhead_ratio_{n}"] = g["median"] / d["median"]
        rows.append({
            "concurrency": n,
            "direct tok/s": n * max_tokens / d["median"],
            "gyre tok/s": n * max_tokens / g["median"],
            "gyre/direct time": g["median"] / d["median"],
        })
    path = write_result(
        "engine",
        {"model": "gyre tiny qwen2 (seed 0)", "model_config": {"hidden_size": model_config.hidden_size,
         "num_hidden_layers": model_config.num_hidden_layers, "vocab_size": model_config.vocab_size},
         "max_tokens": max_tokens, "repeats": repeats, "concurrency": list(CONCURRENCY), "dtype": config.dtype},
        numbers,
    )
    print_table("engine throughput: gyre protocol vs vLLM direct (medians)", rows)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    anyio.run(main_async, args.repeats, args.max_tokens, backend="asyncio")


if __name__ == "__main__":
    main()
