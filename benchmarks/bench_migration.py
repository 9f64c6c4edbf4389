"""KV migration: time to first token on the receiving engine after a switch, migrated vs recomputed.

Two `VLLMEngine`s in this process (A bound to core 0, B to core 1), both with the ExampleConnector
on a shared folder under /dev/shm, serve a ~12.6M-parameter model (hidden 512, 4 layers, 8 heads,
2 KV heads) so that prefill cost matters. Per context size L (2K, 8K, 16K): A generates 64 tokens
from an L-token prompt; the sequence seq = prompt + those tokens is what a switched request
continues from. Then, alternating repeat by repeat, with B's prefix cache reset before each:
- migrated: `A.export_kv(seq)` (timed: `migrate_s`), then B runs seq with max_tokens=1 and loads
  the KV (timed: TTFT), then the export is released;
- recomputed: B runs seq with max_tokens=1 and prefills all of it (timed: TTFT).
Both first tokens and logprobs are checked equal. B is warmed up first (the first request costs
~1.5 s once).

Writes benchmarks/results/migration.json: TTFT min/median/max per L and path, `ttft_ratio_<L>`
(migrated / recomputed medians), `migrate_s_16k` (median export time at 16K) and
`switch_ratio_<L>` ((export + migrated TTFT) / recomputed TTFT). Goal: ttft_ratio_16k <= 0.05.
`--connector nixl` measures vLLM's NixlConnector instead (B pulls from A's memory; needs the
`nixl` package) and writes benchmarks/results/migration_nixl.json with the same keys.

Run: .venv/bin/python -m benchmarks.bench_migration [--repeats 3] [--sizes 2048,8192,16384]
     [--connector example|nixl]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.common import print_table, summarize, write_result
from gyre.config import EngineConfig, KVTransferConfig, ModelConfig
from gyre.engines import GenerateRequest, SamplingParams, collect

GENERATED = 64
MODEL = ModelConfig(
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=32768,
)


def _label(n: int) -> str:
    return f"{round(n / 1024)}k"


async def _ttft(engine, rid: str, seq: list[int], export=None) -> tuple[float, int, float]:
    """Seconds to the first token of a greedy 1-token request on `seq` (loading `export` if
    given); (seconds, token, logprob)."""
    request = GenerateRequest(
        request_id=rid,
        prompt_ids=seq,
        sampling=SamplingParams(max_tokens=1, temperature=0.0),
        kv_import=export,
    )
    first = None
    t0 = time.perf_counter()
    async for delta in engine.generate(request):
        if delta.token_ids and first is None:
            first = (time.perf_counter() - t0, delta.token_ids[0], delta.logprobs[0])
    if first is None:
        raise RuntimeError(f"{rid}: no token")
    return first


async def _start(model_dir: Path, config: EngineConfig, core: int):
    from gyre.engines.vllm_engine import VLLMEngine

    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(core)  # read when the engine process starts
    return await VLLMEngine.start(str(model_dir), config)


async def run(sizes: list[int], repeats: int, connector: str = "example") -> None:
    from gyre.model import init_model_dir

    work = Path(tempfile.mkdtemp(prefix="gyre-bench-migration-"))
    shared = Path(f"/dev/shm/gyre-kv-bench-{os.getpid()}")
    shutil.rmtree(shared, ignore_errors=True)
    model_dir = init_model_dir(work / "model", MODEL)
    max_len = max(sizes) + GENERATED + 64
    config = EngineConfig(
        max_model_len=max_len,
        kv_cache_memory_bytes=512 * 2**20,
        request_timeout_s=1800.0,
        kv_transfer=KVTransferConfig(
            connector=connector,
            shared_dir=str(shared) if connector == "example" else "",
            lease_s=60.0,
        ),
    )
    a = b = None
    rows, numbers = [], {}
    try:
        a = await _start(model_dir, config, 0)
        b = await _start(model_dir, config, 1)
        await collect(
            b,
            GenerateRequest(
                request_id="warm",
                prompt_ids=list(range(10, 300)),
                sampling=SamplingParams(max_tokens=4, temperature=0.0),
            ),
        )
        rng = random.Random(0)
        for size in sizes:
            prompt = [rng.randrange(10, 1000) for _ in range(size)]
            [gen] = await collect(
                a,
                GenerateRequest(
                    request_id=f"gen-{size}",
                    prompt_ids=prompt,
                    sampling=SamplingParams(max_tokens=GENERATED, temperature=0.0),
                ),
            )
            seq = prompt + gen.token_ids
            loaded_before = b.statistics().kv_tokens_loaded
            migrated, recomputed, exports, switch = [], [], [], []
            for r in range(repeats):
                await b.llm.reset_prefix_cache()
                export = await a.export_kv(seq)
                t_m, tok_m, lp_m = await _ttft(b, f"mig-{size}-{r}", seq, export)
                await b.release_kv(export.key)
                await b.llm.reset_prefix_cache()
                t_r, tok_r, lp_r = await _ttft(b, f"rec-{size}-{r}", seq)
                if tok_m != tok_r or abs(lp_m - lp_r) > 1e-4:
                    raise RuntimeError(
                        f"L={size}: migrated ({tok_m}, {lp_m}) != recomputed ({tok_r}, {lp_r})"
                    )
                migrated.append(t_m)
                recomputed.append(t_r)
                exports.append(export.seconds)
                switch.append(export.seconds + t_m)
            loaded = b.statistics().kv_tokens_loaded - loaded_before
            if loaded < repeats * (len(seq) - config.block_size):
                raise RuntimeError(
                    f"L={size}: B loaded {loaded} tokens over {repeats} migrations of {len(seq)}"
                )
            lab = _label(size)
            sm, sr = summarize(migrated), summarize(recomputed)
            numbers[f"ttft_migrated_s_{lab}"] = sm
            numbers[f"ttft_recomputed_s_{lab}"] = sr
            numbers[f"migrate_s_{lab}"] = summarize(exports)["median"]
            numbers[f"ttft_ratio_{lab}"] = sm["median"] / sr["median"]
            numbers[f"switch_ratio_{lab}"] = summarize(switch)["median"] / sr["median"]
            numbers[f"export_bytes_{lab}"] = export.bytes
            rows.append(
                {
                    "context": len(seq),
                    "ttft migrated s": sm["median"],
                    "ttft recomputed s": sr["median"],
                    "ratio": numbers[f"ttft_ratio_{lab}"],
                    "export s": numbers[f"migrate_s_{lab}"],
                    "export MB": export.bytes / 2**20,
                }
            )
        leftover = sorted(os.listdir(shared)) if shared.exists() else []
        if leftover:
            raise RuntimeError(f"shared folder not empty at the end: {leftover}")
    finally:
        for engine in (a, b):
            if engine is not None:
                engine.shutdown()
        shutil.rmtree(shared, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    config_out = {
        "model": {
            k: getattr(MODEL, k)
            for k in (
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
            )
        },
        "sizes": sizes,
        "generated": GENERATED,
        "repeats": repeats,
        "dtype": config.dtype,
        "block_size": config.block_size,
        "connector": "example (GyreKVConnector, /dev/shm)"
        if connector == "example"
        else "nixl (UCX, progress thread off)",
        "binding": "A core 0, B core 1",
    }
    write_result(
        "migration" if connector == "example" else f"migration_{connector}", config_out, numbers
    )
    print_table("KV migration: TTFT on the receiving engine (medians)", rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", default="2048,8192,16384")
    parser.add_argument("--connector", choices=("example", "nixl"), default="example")
    args = parser.parse_args()
    asyncio.run(run([int(s) for s in args.sizes.split(",")], args.repeats, args.connector))


if __name__ == "__main__":
    main()
