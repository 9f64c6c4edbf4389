"""What the KV connector costs when it is on but unused: cell start-up and plain generation, with
`[engine.kv_transfer] connector = "example"` against `"none"`.

One vLLM cell at a time (`spawn_cell`, the runtime's own start path) on the tiny model (the
runtime's default: per-step Python overhead dominates, so any per-step connector cost shows most
here). The two connectors alternate run by run (none, example, example, none, ...), `--repeats`
times each, under two CPU bindings: `auto` (vLLM picks; one cell alone, as the colocate policy
runs) and `core0` (`VLLM_CPU_OMP_THREADS_BIND=0`, as the runtime binds each of several cells).
Per cell: start-up (spawn to ready), a warm-up request, then
- decode: 8 concurrent requests of 48-token prompts, 128 sampled tokens each (seeded,
  temperature 1): output tokens per second;
- prefill: one 1,536-token prompt, 1 token out: seconds to the end.
The worker's OpenMP thread count is read from the cell log (vLLM's binding line).

Writes benchmarks/results/connector_idle.json: per binding and connector the min/median/max of
`startup_s`, `decode_tok_s`, `prefill_s`, the `omp_threads` seen, and the ratios of the medians
(example / none). The machine is shared: read the spread before the medians. The committed file
also keeps, under `before_reserved_core_fix` (added by hand), the run made before
`FolderTransport.prepare` asked vLLM for no extra reserved core: `auto` then gave the connector's
cell 2 OpenMP threads on 2 cores, not 1.

Run: .venv/bin/python -m benchmarks.bench_connector_idle [--repeats 3] [--bindings auto,core0]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import anyio

from benchmarks.common import print_table, summarize, write_result
from gyre.config import EngineConfig, KVTransferConfig, ModelConfig
from gyre.engines import GenerateRequest, SamplingParams, collect

DECODE_REQUESTS = 8
DECODE_PROMPT = 48
DECODE_TOKENS = 128
PREFILL_PROMPT = 1536
MAX_MODEL_LEN = 2048


def _config(connector: str, shared: Path) -> EngineConfig:
    return EngineConfig(
        max_model_len=MAX_MODEL_LEN,
        request_timeout_s=600.0,
        kv_transfer=KVTransferConfig(
            connector=connector, shared_dir=str(shared) if connector == "example" else ""
        ),
    )


def _omp_threads(log: Path) -> int | None:
    """OpenMP threads of the engine's worker: the cores of vLLM's `core ids=[...]` binding line
    (None if the log has none)."""
    ids = re.search(r"core ids=\[([0-9, ]*)\]", log.read_text(errors="replace"))
    return len(ids.group(1).split(",")) if ids and ids.group(1).strip() else None


async def _decode(engine, tag: str) -> float:
    """Output tokens per second of DECODE_REQUESTS concurrent sampled requests."""
    counts: list[int] = []

    async def one(i: int) -> None:
        prompt = [10 + (37 * i + 11 * j) % 900 for j in range(DECODE_PROMPT)]
        [choice] = await collect(
            engine,
            GenerateRequest(
                request_id=f"{tag}-d{i}",
                prompt_ids=prompt,
                sampling=SamplingParams(max_tokens=DECODE_TOKENS, temperature=1.0, seed=i),
            ),
        )
        counts.append(len(choice.token_ids))

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(DECODE_REQUESTS):
            tg.start_soon(one, i)
    return sum(counts) / (time.perf_counter() - t0)


async def _prefill(engine, tag: str, seed: int) -> float:
    prompt = [10 + (seed * 7919 + 13 * j) % 900 for j in range(PREFILL_PROMPT)]
    t0 = time.perf_counter()
    await collect(
        engine,
        GenerateRequest(
            request_id=f"{tag}-p",
            prompt_ids=prompt,
            sampling=SamplingParams(max_tokens=1, temperature=0.0),
        ),
    )
    return time.perf_counter() - t0


async def _one_cell(model_dir: Path, connector: str, binding: str, root: Path, run: int) -> dict:
    from gyre.cell.client import CellClient
    from gyre.cell.spawn import spawn_cell, wait_cell_ready

    shared = Path(tempfile.mkdtemp(prefix="gyre-kv-bench-idle-", dir="/dev/shm"))
    config = _config(connector, shared)
    log = root / f"cell-{binding}-{connector}-{run}.log"
    env = {"VLLM_CPU_OMP_THREADS_BIND": "0"} if binding == "core0" else None
    t0 = time.perf_counter()
    cell = spawn_cell(model_dir, config, log_path=log, env=env)
    try:
        url = await anyio.to_thread.run_sync(wait_cell_ready, cell, config.startup_timeout_s)
        startup = time.perf_counter() - t0
        async with CellClient(url, config) as engine:
            await collect(
                engine,
                GenerateRequest(
                    request_id="warm",
                    prompt_ids=list(range(10, 60)),
                    sampling=SamplingParams(max_tokens=8, temperature=1.0, seed=0),
                ),
            )
            tag = f"{binding}-{connector}-{run}"
            decode = await _decode(engine, tag)
            prefill = await _prefill(engine, tag, run)
    finally:
        await anyio.to_thread.run_sync(cell.stop)
        shutil.rmtree(shared, ignore_errors=True)
    return {
        "startup_s": startup,
        "decode_tok_s": decode,
        "prefill_s": prefill,
        "omp_threads": _omp_threads(log),
    }


async def run(repeats: int, bindings: list[str]) -> None:
    from gyre.model import init_model_dir

    if "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        raise SystemExit("unset VLLM_CPU_OMP_THREADS_BIND: the benchmark sets the binding itself")
    root = Path(tempfile.mkdtemp(prefix="gyre-bench-connector-idle-"))
    model_dir = init_model_dir(root / "model", ModelConfig(seed=0))
    samples: dict[tuple[str, str], list[dict]] = {}
    try:
        for binding in bindings:
            for r in range(repeats):
                order = ("none", "example") if r % 2 == 0 else ("example", "none")
                for connector in order:
                    got = await _one_cell(model_dir, connector, binding, root, r)
                    print(binding, connector, r, got, flush=True)
                    samples.setdefault((binding, connector), []).append(got)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    numbers: dict[str, object] = {}
    rows = []
    for binding in bindings:
        medians = {}
        for connector in ("none", "example"):
            got = samples[(binding, connector)]
            key = f"{binding}_{connector}"
            for field in ("startup_s", "decode_tok_s", "prefill_s"):
                numbers[f"{field}_{key}"] = summarize([g[field] for g in got])
                medians[(connector, field)] = numbers[f"{field}_{key}"]["median"]
            numbers[f"omp_threads_{key}"] = sorted({g["omp_threads"] for g in got}, key=str)
            rows.append(
                {
                    "binding": binding,
                    "connector": connector,
                    "start-up s": medians[(connector, "startup_s")],
                    "decode tok/s": medians[(connector, "decode_tok_s")],
                    "prefill s": medians[(connector, "prefill_s")],
                    "omp threads": numbers[f"omp_threads_{key}"],
                }
            )
        for field in ("startup_s", "decode_tok_s", "prefill_s"):
            numbers[f"ratio_{field}_{binding}"] = (
                medians[("example", field)] / medians[("none", field)]
            )
    config_out = {
        "model": "tiny (ModelConfig() defaults)",
        "max_model_len": MAX_MODEL_LEN,
        "repeats": repeats,
        "order": "alternating none/example per run",
        "decode": f"{DECODE_REQUESTS} concurrent x {DECODE_TOKENS} tokens, prompt {DECODE_PROMPT}",
        "prefill": f"{PREFILL_PROMPT}-token prompt, 1 token out",
        "bindings": bindings,
        "load_avg_at_end": os.getloadavg(),
    }
    write_result("connector_idle", config_out, numbers)
    print_table("KV connector on but unused (medians; ratios are example / none)", rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bindings", default="auto,core0")
    args = parser.parse_args()
    anyio.run(run, args.repeats, args.bindings.split(","))


if __name__ == "__main__":
    main()
