"""Learning of the main job: held-out pass rate before and after `make run`'s RL, 3 seeds.

Each seed runs the `make run` job (examples/cpu.toml: the warm start, then the elastic runtime on 2
cells on `learnable-long`) in its own run folder with `seed` = the seed, at the config's own steps
unless `--steps` says otherwise. Each seed trains its own warm start (`warm_start.seed` + the seed,
into `<warm-start folder>-seed<seed>`; cached like any warm start), so the gain is shown not to hang
on one warm start; `--shared-warm-start` uses the config's one for every seed. Everything is read
back from the run folder: the held-out evaluations before the first and after the last step
(`metrics.jsonl`, `eval` records), the trained steps (`step` records: model calls, partially scored
executions, dedup, same-version mismatch), the cells' role changes (`timeline.jsonl`) and which
executions ran a sub-agent or compacted (`calls.log`, roles of the calls). Writes
benchmarks/results/main_job.json (after every seed, so a bench stopped early keeps the seeds it
finished) with the keys of issue 21's acceptance:

- `gain_points` (after - before, percentage points, per seed), `gain_points_mean`: goal mean >= 15
  and every seed > 0; the pass rates' binomial standard errors sqrt(p (1 - p) / n) beside them;
  `reward_gain` / `reward_gain_mean`: the same for the held-out mean reward (no goal);
- `wall_s` (per seed, the whole job: warm start or its cache, evaluations, steps);
- `calls_per_execution_mean` (model calls / trained executions, goal >= 8), `dedup_ratio_mean`
  (mean of the steps' selected tokens one by one / packed, goal >= 1.5), `partial_fraction`
  (trained executions stopped at a limit and partially scored, goal > 0), `subagent_fraction` and
  `compaction_fraction` (executions of the call log with a `sub_agent` / `main_summary` call,
  goal > 0), `role_switches_per_step_mean` (a cell entering `switching`, per step, goal > 0),
  `same_version_mismatch_max` (worst step, goal <= 1e-5);
- `warm_start_sha256` (sha256 of the last seed's warm-started `model.safetensors`; every seed's
  in `warm_start_sha256s`) and `warm_start_heldout_pass_rate` (the first held-out evaluation:
  the warm-started model, mean over seeds).

Run: .venv/bin/python -m benchmarks.bench_learning [--config examples/cpu.toml] [--seeds 0 1 2]
     [--steps N] [--shared-warm-start]
"""

from __future__ import annotations

import argparse
import hashlib
import math
import shutil
import statistics
import time
from collections import defaultdict
from pathlib import Path

import msgspec

from benchmarks.common import print_table, write_result
from gyre.config import RunConfig, load_config
from gyre.job import run
from gyre.model.sft import output_dir
from gyre.runtime.metrics import EvalMetrics, StepMetrics, read_metrics
from gyre.runtime.timeline import read_timeline
from gyre.tito.log import read_log

GOALS = {
    "gain_points_mean": ">= 15, every seed > 0",
    "calls_per_execution_mean": ">= 8",
    "dedup_ratio_mean": ">= 1.5",
    "partial_fraction": "> 0",
    "subagent_fraction": "> 0",
    "role_switches_per_step_mean": "> 0",
    "same_version_mismatch_max": "<= 1e-5",
}


def binomial_se(p: float, n: int) -> float:
    """Standard error of a pass rate `p` measured on `n` independent executions (fraction)."""
    return math.sqrt(p * (1.0 - p) / n)


def role_switches(run_dir: Path) -> int:
    """Role switches of the run's cells: each cell leaving its role enters `switching` first
    (`timeline.jsonl`'s role records)."""
    return sum(change.role == "switching" for change in read_timeline(run_dir).roles)


def seed_numbers(run_dir: Path, wall_s: float) -> dict:
    """One finished run's numbers, read from its folder."""
    records = read_metrics(run_dir)
    evals = [r for r in records if isinstance(r, EvalMetrics) and r.split == "heldout"]
    steps = [r for r in records if isinstance(r, StepMetrics)]
    if not evals or not steps:
        raise RuntimeError(f"{run_dir}: {len(evals)} held-out evaluations, {len(steps)} steps")
    before, after = evals[0], evals[-1]
    se_before = binomial_se(before.pass_rate, before.executions)
    se_after = binomial_se(after.pass_rate, after.executions)
    roles: dict[str, set[str]] = defaultdict(set)
    for call in read_log(run_dir / "calls.log").calls:
        roles[call.execution_id].add(str(call.role))
    if not roles:
        raise RuntimeError(f"{run_dir}: no model call in calls.log (every execution failed?)")
    executions = sum(s.executions for s in steps)
    mismatches = [s.same_version_mismatch_mean for s in steps]
    return {
        "before": before.pass_rate,
        "after": after.pass_rate,
        "before_mean_reward": before.mean_reward,
        "after_mean_reward": after.mean_reward,
        "gain_points": 100.0 * (after.pass_rate - before.pass_rate),
        "gain_se_points": 100.0 * math.hypot(se_before, se_after),
        "eval_executions": after.executions,
        "steps": len(steps),
        "wall_s": wall_s,
        "trained_executions": executions,
        "calls_per_execution": sum(s.model_calls for s in steps) / executions,
        "dedup_ratio": statistics.fmean(s.dedup_ratio for s in steps),
        "partial_fraction": sum(s.partial for s in steps) / executions,
        # the executions `rl.stop_penalty` applies to
        "stopped_executions": sum(s.partial for s in steps),
        "subagent_fraction": sum("sub_agent" in r for r in roles.values()) / len(roles),
        "compaction_fraction": sum("main_summary" in r for r in roles.values()) / len(roles),
        "role_switches_per_step": role_switches(run_dir) / len(steps),
        "same_version_mismatch_max": max(
            (m for m in mismatches if not math.isnan(m)), default=math.nan
        ),
    }


def seed_config(base: RunConfig, seed: int, run_dir: Path, own_warm_start: bool) -> RunConfig:
    """`base` for one seed: its run folder and `seed`; with `own_warm_start`, a warm start of its
    own, `warm_start.seed` + `seed` into `<warm-start folder>-seed<seed>` (the gain shown not to
    hang on one warm start: issue 21's reproducibility)."""
    config = msgspec.structs.replace(base, run_dir=str(run_dir), seed=seed)
    if not (own_warm_start and base.warm_start.enabled):
        return config
    folder = output_dir(base.model.path, base.warm_start)
    warm = msgspec.structs.replace(
        base.warm_start, seed=base.warm_start.seed + seed, path=f"{folder}-seed{seed}"
    )
    return msgspec.structs.replace(config, warm_start=warm)


def numbers(per_seed: list[dict], warm_start_sha256: str) -> dict:
    gains = [r["gain_points"] for r in per_seed]
    return {
        "gain_points": gains,
        "gain_points_mean": statistics.fmean(gains),
        # seeds are independent runs: the mean's standard error from the per-seed binomial ones
        "gain_se_points_mean": math.sqrt(sum(r["gain_se_points"] ** 2 for r in per_seed))
        / len(per_seed),
        "every_seed_positive": all(g > 0 for g in gains),
        # the held-out mean reward (the share of files right, partial credit): the signal RL
        # trains on, less coarse than the pass rate (all 4 files right) on 32 executions
        "reward_gain": [r["after_mean_reward"] - r["before_mean_reward"] for r in per_seed],
        "reward_gain_mean": statistics.fmean(
            r["after_mean_reward"] - r["before_mean_reward"] for r in per_seed
        ),
        "wall_s": [r["wall_s"] for r in per_seed],
        "calls_per_execution_mean": statistics.fmean(r["calls_per_execution"] for r in per_seed),
        "dedup_ratio_mean": statistics.fmean(r["dedup_ratio"] for r in per_seed),
        "partial_fraction": statistics.fmean(r["partial_fraction"] for r in per_seed),
        "subagent_fraction": statistics.fmean(r["subagent_fraction"] for r in per_seed),
        "compaction_fraction": statistics.fmean(r["compaction_fraction"] for r in per_seed),
        "role_switches_per_step_mean": statistics.fmean(
            r["role_switches_per_step"] for r in per_seed
        ),
        "same_version_mismatch_max": max(r["same_version_mismatch_max"] for r in per_seed),
        "warm_start_sha256": warm_start_sha256,
        "warm_start_sha256s": [r["warm_start_sha256"] for r in per_seed],
        "warm_start_heldout_pass_rate": statistics.fmean(r["before"] for r in per_seed),
        "goals": GOALS,
        "per_seed": per_seed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="examples/cpu.toml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=0, help="RL steps (0: the config's own)")
    parser.add_argument(
        "--shared-warm-start",
        dest="warm_start_per_seed",
        action="store_false",
        help="one warm start for every seed (default: each seed trains its own)",
    )
    args = parser.parse_args()
    base = load_config(args.config)
    if args.steps:
        base = msgspec.structs.replace(
            base, loop=msgspec.structs.replace(base.loop, steps=args.steps)
        )
    config = {
        "config": args.config,
        "seeds": args.seeds,
        "loop": msgspec.to_builtins(base.loop),
        "cells": msgspec.to_builtins(base.cells),
        "scheduler": msgspec.to_builtins(base.scheduler),
        "trainer": msgspec.to_builtins(base.trainer),
        "rl": msgspec.to_builtins(base.rl),
        "warm_start": msgspec.to_builtins(base.warm_start),
        "suites": list(base.tasks.suites),
        "agent_command": list(base.tasks.harness.agent_command),
    }
    per_seed: list[dict] = []
    for seed in args.seeds:
        run_dir = Path("runs") / f"bench-learning-seed{seed}"
        shutil.rmtree(run_dir, ignore_errors=True)
        config_s = seed_config(base, seed, run_dir, args.warm_start_per_seed)
        t0 = time.perf_counter()
        run(config_s)
        numbers_s = seed_numbers(run_dir, time.perf_counter() - t0)
        weights = output_dir(config_s.model.path, config_s.warm_start) / "model.safetensors"
        sha = hashlib.sha256(weights.read_bytes()).hexdigest() if weights.is_file() else ""
        per_seed.append(
            {
                "seed": seed,
                "warm_start_seed": config_s.warm_start.seed,
                "warm_start_sha256": sha,
                **numbers_s,
            }
        )
        result = numbers(per_seed, sha)
        path = write_result(
            "main_job", {**config, "seeds_done": [r["seed"] for r in per_seed]}, result
        )
    print_table(
        "held-out pass rate before / after RL",
        [{k: r[k] for k in ("seed", "before", "after", "gain_points", "wall_s")} for r in per_seed],
    )
    print(
        f"mean gain {result['gain_points_mean']:.1f} "
        f"+- {result['gain_se_points_mean']:.1f} points; wrote {path}"
    )


if __name__ == "__main__":
    main()
