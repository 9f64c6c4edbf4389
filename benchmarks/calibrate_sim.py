"""Calibrate the cluster simulator on this machine's bench_schedules run, and score it.

Reads the three runs `bench_schedules` leaves in runs/bench-schedules-<policy>/ and its result
file, and builds `examples/sim/cpu-calibrated.toml` from what was measured there:

- execution wall times: from the call log, first call's start to last call's end, plus the
  execution's own last tool sleep (its `gyre.agents.longtail` draw) -> lognormal median and sigma
  (of the log), cap at the longest;
- training seconds per execution: "train" cell-seconds of the elastic run's timeline over the
  executions it trained; optimizer step: median "step" interval; weight sync: median "load";
- switch costs: median "switch" interval into each role (timeline role changes give the target);
- capacity (2 per cell), cells (4), batch and group sizes as in the bench.

The simulator then runs the three policies on that config (the bench's fixed Async split of 1
training cell, streaming only for Elastic) and `calibration_error` = the largest relative error of
the simulated step-time ratios (colocate / elastic, async / elastic) against the measured ones.
Writes benchmarks/results/calibration.json. Goal (issue #8): calibration_error <= 0.25.

Run after bench_schedules: .venv/bin/python -m benchmarks.calibrate_sim
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import msgspec

from benchmarks.bench_schedules import CAPACITY, WORKLOAD
from benchmarks.common import print_table, write_result
from gyre.agents.longtail import draw_plan, plan_seed
from gyre.runtime.metrics import StepMetrics, read_metrics
from gyre.runtime.timeline import read_timeline
from gyre.sim import SimConfig, Workload, build_policy, simulate
from gyre.tito.log import read_log

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "examples/sim/cpu-calibrated.toml"
POLICIES = ("colocate", "async", "elastic")


def execution_seconds(run_dir: Path) -> list[float]:
    log = read_log(run_dir / "calls.log")
    out = []
    for eid in log.summaries:
        calls = log.for_execution(eid)
        if calls:
            plan = draw_plan(plan_seed(eid), WORKLOAD)
            out.append(
                max(c.finished_s for c in calls) - min(c.started_s for c in calls) + plan.tool_s[-1]
            )
    return out


def measured_costs(run_dir: Path) -> dict[str, float]:
    timeline = read_timeline(run_dir)
    by_kind: dict[str, list[float]] = {}
    for iv in timeline.intervals:
        by_kind.setdefault(iv.kind, []).append(iv.end_s - iv.start_s)
    into: dict[str, list[float]] = {"train": [], "rollout": []}
    roles = sorted(timeline.roles, key=lambda r: (r.cell, r.t_s))
    for a, b in zip(roles, roles[1:]):
        if a.cell == b.cell and a.role == "switching" and b.role in into:
            into[b.role].append(b.t_s - a.t_s)
    steps = [r for r in read_metrics(run_dir) if isinstance(r, StepMetrics)]
    trained = sum(m.executions for m in steps)
    return {
        "train_s_per_execution": sum(by_kind.get("train", [])) / trained,
        "optimizer_step_s": statistics.median(by_kind.get("step", [0.0])),
        "weight_sync_s": statistics.median(by_kind.get("load", [0.0])),
        "switch_to_train_s": statistics.median(into["train"]) if into["train"] else 0.0,
        "switch_to_rollout_s": statistics.median(into["rollout"]) if into["rollout"] else 0.0,
    }


def build_config(durations: list[float], costs: dict[str, float], steps: int) -> SimConfig:
    logs = [math.log(d) for d in durations]
    tokens = 1000.0  # every execution "costs" the same tokens: the train time is per execution
    params = 1e6
    return msgspec.convert(
        {
            "name": "cpu-calibrated",
            "out_dir": "runs/sim/cpu-calibrated",
            "cluster": {
                "num_cells": 4,
                "cell_peak_flops_per_s": 6 * params * tokens / costs["train_s_per_execution"],
                "train_mfu": 1.0,
                "kv_cache_bytes_per_cell": CAPACITY * tokens,
            },
            "model": {
                "active_params": params,
                "total_params": params,
                "bytes_per_param": 1.0,
                "num_layers": 1,
                "attention_width": 1,
                "kv_bytes_per_token": 1.0,
            },
            "workload": {
                "num_steps": steps,
                "batch_executions": 6,
                "group_size": 3,
                "median_duration_s": math.exp(statistics.fmean(logs)),
                "sigma": statistics.pstdev(logs),
                "timeout_s": max(durations),
                "decode_fraction": 0.0,
                "decode_tokens_per_s": 0.0,
                "tool_tokens_per_s": 0.0,
                "prompt_tokens": int(tokens),
                "max_context_tokens": int(tokens),
                "seed": 0,
            },
            "costs": {
                "switch_to_train_s": costs["switch_to_train_s"],
                "switch_to_rollout_s": costs["switch_to_rollout_s"],
                "weight_sync_bytes_per_s": params / max(costs["weight_sync_s"], 1e-6),
                "kv_migration_bytes_per_s": 1e12,
                "optimizer_step_s": costs["optimizer_step_s"],
            },
            # bench_schedules measured the node runtime, whose unstreamed batch is the step's own
            # groups
            "policies": {
                "async_num_train_cells": 1,
                "async_max_staleness_steps": 1,
                "elastic_max_staleness_steps": 1,
                "unstreamed_batch": "dispatched",
            },
        },
        SimConfig,
    )


def write_toml(config: SimConfig, path: Path, note: str) -> None:
    lines = [f"# {line}" for line in note.splitlines()]
    data = msgspec.to_builtins(config)
    for key in ("name", "out_dir"):
        lines.append(f"{key} = {json.dumps(data.pop(key))}")
    for section, values in data.items():
        lines += ["", f"[{section}]"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    bench = json.loads((ROOT / "benchmarks/results/schedules.json").read_text())
    measured = bench.get("numbers", bench)
    runs = {p: ROOT / "runs" / f"bench-schedules-{p}" for p in POLICIES}
    durations = [d for p in POLICIES for d in execution_seconds(runs[p])]
    costs = measured_costs(runs["elastic"])
    steps = 48  # simulate many steps: the ratio of mean step times, not one draw's
    config = build_config(durations, costs, steps)
    write_toml(
        config,
        OUT,
        "Calibrated on this 2-core machine by benchmarks/calibrate_sim.py from the\n"
        "bench_schedules runs (4 cells, tiny model, long-tail tool-bound executions).",
    )
    workload = Workload(config)
    sim = {
        p: simulate(config, build_policy(config, p, 1), workload).makespan_s / steps
        for p in POLICIES
    }
    key = "step_s_mean_{}" if "step_s_mean_elastic" in measured else "step_s_{}"
    real = {p: measured[key.format(p)] for p in POLICIES}
    ratios = {
        p: (sim[p] / sim["elastic"], real[p] / real["elastic"]) for p in ("colocate", "async")
    }
    error = max(abs(s - m) / m for s, m in ratios.values())
    numbers = {
        "calibration_error": error,
        "sim_step_s": sim,
        "measured_step_s": real,
        "ratio_sim_vs_measured": {p: {"sim": s, "measured": m} for p, (s, m) in ratios.items()},
        "fitted": {
            "median_duration_s": config.workload.median_duration_s,
            "sigma": config.workload.sigma,
            "timeout_s": config.workload.timeout_s,
            "executions": len(durations),
            **costs,
        },
    }
    path = write_result(
        "calibration",
        {"config": str(OUT.relative_to(ROOT)), "measured_from": key.format("*")},
        numbers,
    )
    print_table(
        "simulated vs measured step-time ratios (policy / elastic)",
        [{"policy": p, "sim": s, "measured": m} for p, (s, m) in ratios.items()],
    )
    print(f"calibration_error {error:.3f}; wrote {OUT} and {path}")


if __name__ == "__main__":
    main()
