"""Schedules: Colocate vs Async vs Elastic on one long-tail workload, real cells on this machine.

Each policy gets 4 fresh cells (each a vLLM CPU engine and a DeepSpeed trainer on the tiny model,
one run-wide gloo gradient group) and runs the same executions: the `longtail` suite with the
`gyre.agents.longtail` agent, whose executions draw lognormal turn counts and spend most of their
wall time in (sleeping) tool calls, as hours-long executions do (`docs/notes/vllm-cpu.md`: on 2
cores at most one computing engine per core pays). Execution IDs, hence every execution's
draw, are the same for all three policies.

Reported per policy: median step seconds (steps after the first, whose start-up differs), the
mean step seconds of the same steps (last step's end - first step's end over the steps), role
switches and their seconds (measured by the driver around the whole switch: router drain + the
cell's own switch), utilisation by slots (`gyre.runtime.timeline.utilisation`: busy cell-seconds
over cells x wall) and by CPU (CPU seconds of every cell process tree over wall x cores).

The headline `elastic_speedup_vs_best_other` is throughput: the best other policy's mean step
seconds over elastic's (issue #22: the median of bimodal step times flips from run to run; goal
>= 1.4). Beside it: the same by whole-run wall time (`..._wall`, start-up included) and by the
median step (`..._median`, the old headline).

Run: .venv/bin/python -m benchmarks.bench_schedules [--steps 4] [--policies colocate async elastic]
Writes benchmarks/results/schedules.json.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import time
from pathlib import Path

import anyio
import msgspec

from benchmarks.common import print_table, write_result
from gyre.agents.longtail import LongtailSettings, longtail_command
from gyre.config import config_from_dict
from gyre.job import ensure_model
from gyre.runtime.elastic_job import run_elastic
from gyre.runtime.timeline import read_timeline, utilisation

REPO = Path(__file__).resolve().parents[1]
CAPACITY = 2
"""Executions per rollout cell: 8 slots on 4 cells stay below the staleness bound's 2 batches
(12), so rollout capacity, not admission, limits every policy."""
WORKLOAD = LongtailSettings(
    turns_median=4.0,
    turns_sigma=0.8,
    max_turns=24,
    tool_median_s=5.0,
    tool_sigma=0.5,
    tool_max_s=30.0,
    max_tokens=16,
)
"""Tool-bound: an execution costs about 3 CPU-seconds here (agent and verifier start-up, its model
calls; measured 2026-11-29 with 1.5 s tools: 463 CPU-s for 144 executions), so with 1.5 s tools 8
busy slots asked for ~2.7 of the 2 cores and every policy was CPU-bound. 5 s tools bring a full
8 slots to ~1 core: the slots, which the policies move, bound the steps, as in a cluster whose
executions wait on tools for hours."""


def _cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and of every child process it has waited for:
    the cells, their vLLM engine processes and the agents' supervisors count once they exited."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def bench_config(policy: str, run_dir: Path, model: Path, steps: int) -> object:
    return config_from_dict(
        {
            "run_dir": str(run_dir),
            "seed": 0,
            "model": {"path": str(model)},
            "engine": {"max_model_len": 2048, "kv_cache_memory_bytes": 64 * 2**20},
            "cells": {"num_cells": 4},
            "scheduler": {
                "policy": policy,
                "capacity_per_cell": CAPACITY,
                "async_train_cells": 1,
                "max_staleness_steps": 1,
                "streaming": policy == "elastic",
            },
            "loop": {"steps": steps, "batch_executions": 6, "group_size": 3},
            "trajectory": {"micro_batch_tokens": 4096},
            "trainer": {"zero_stage": 1, "learning_rate": 1e-5},
            "tasks": {
                "suites": [str(REPO / "examples/tasks/longtail")],
                "harness": {"agent_command": list(longtail_command(WORKLOAD))},
            },
            "warm_start": {"enabled": False},
        }
    )


async def _measure(config) -> dict:
    t0 = time.perf_counter()
    cpu0 = _cpu_seconds()
    runtime = await run_elastic(config, Path(config.model.path), launch="bench")
    wall = time.perf_counter() - t0
    cpu = _cpu_seconds() - cpu0  # the cells have exited and been waited for: their CPU is in
    records = runtime.ledger.records
    start = records[0].end_s  # steady state: from the end of step 1 to the end of the last step
    end = records[-1].end_s
    timeline = read_timeline(config.run_dir)
    util = utilisation(timeline, 4, start, end)
    return {
        "step_s": [r.step_s for r in records],
        "step_s_median": statistics.median(r.step_s for r in records[1:]),
        "step_s_mean": (records[-1].end_s - records[0].end_s) / (len(records) - 1),
        "switches": runtime.state.switches_done,
        "switch_s": runtime.state.switch_s,
        "utilisation_slots": util.busy,
        "slot_fill": util.slot_fill,
        "cell_s_by_kind": dict(util.cell_s_by_kind),
        "cpu_utilisation": cpu / (wall * (os.cpu_count() or 1)),
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--policies", nargs="+", default=["colocate", "async", "elastic"])
    args = parser.parse_args()
    model = ensure_model(
        config_from_dict({"model": {"path": "runs/model-tiny", "init_if_missing": True}})
    )
    results = {}
    for policy in args.policies:
        run_dir = REPO / "runs" / f"bench-schedules-{policy}"
        shutil.rmtree(run_dir, ignore_errors=True)
        results[policy] = anyio.run(
            _measure, bench_config(policy, run_dir, model, args.steps), backend="trio"
        )
        print(policy, {k: v for k, v in results[policy].items() if k != "switch_s"}, flush=True)
    numbers = {f"step_s_{p}": r["step_s_median"] for p, r in results.items()}
    numbers |= {f"step_s_mean_{p}": r["step_s_mean"] for p, r in results.items()}
    if "elastic" in results:
        e = results["elastic"]
        numbers["utilisation_elastic"] = e["utilisation_slots"]
        numbers["cpu_utilisation_elastic"] = e["cpu_utilisation"]
        numbers["switch_s_median"] = statistics.median(e["switch_s"]) if e["switch_s"] else None
        numbers["switch_s_max"] = max(e["switch_s"], default=None)
        others = [p for p in ("colocate", "async") if p in results]
        if others:
            # throughput: steps per second after step 1 (mean step), best other over elastic
            numbers["elastic_speedup_vs_best_other"] = (
                min(numbers[f"step_s_mean_{p}"] for p in others) / numbers["step_s_mean_elastic"]
            )
            numbers["elastic_speedup_vs_best_other_wall"] = (
                min(results[p]["wall_s"] for p in others) / e["wall_s"]
            )
            numbers["elastic_speedup_vs_best_other_median"] = (
                min(numbers[f"step_s_{p}"] for p in others) / numbers["step_s_elastic"]
            )
    numbers["per_policy"] = results
    params = {
        "workload": msgspec.to_builtins(
            msgspec.json.decode(msgspec.json.encode(WORKLOAD.__dict__))
        ),
        "steps": args.steps,
        "cells": 4,
        "capacity_per_cell": CAPACITY,
        "batch_executions": 6,
        "group_size": 3,
    }
    path = write_result("schedules", params, numbers)
    print_table(
        "schedules (median step seconds after step 1)",
        [
            {
                "policy": p,
                "step_s": r["step_s_median"],
                "switches": r["switches"],
                "cpu_utilisation": r["cpu_utilisation"],
            }
            for p, r in results.items()
        ],
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
