"""Learning: held-out pass rate of the `learnable` suite before and after N RL steps, 3 seeds.

Each seed runs the `make run` job (examples/cpu.toml: cached warm start, then RL on the real
engines) in its own run folder with `seed` = the seed; the held-out evaluations before the first
and after the last step come from its metrics. Writes benchmarks/results/learning.json with
`gain_points` (after - before, percentage points, per seed), `gain_points_mean`, the pass rates
with their binomial standard errors (sqrt(p (1 - p) / n), n = held-out executions of that
evaluation; the gain's is sqrt(se_before^2 + se_after^2), the two evaluations being independent
draws), the number of steps and the wall time per seed. Goal: mean gain >= 15 points, every
seed > 0. N defaults to 16 steps (6 tasks x 4 executions each: 4 passes over the 24 training tasks);
`make run` itself stops at the config's 8 to stay within 20 minutes, so each seed is also evaluated
there (`make_run_gain_points`; seed 0's first steps are the `make run` job's).

Run: .venv/bin/python -m benchmarks.bench_learning [--config examples/cpu.toml] [--seeds 0 1 2]
     [--steps 16]
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import time
from pathlib import Path

import msgspec

from benchmarks.common import print_table, write_result
from gyre.config import load_config
from gyre.job import run
from gyre.runtime.metrics import EvalMetrics, read_metrics


def binomial_se(p: float, n: int) -> float:
    """Standard error of a pass rate `p` measured on `n` independent executions (fraction)."""
    return math.sqrt(p * (1.0 - p) / n)


def _numbers(per_seed: list[dict], base) -> dict:
    gains = [r["gain_points"] for r in per_seed]
    return {
        "gain_points": gains,
        "gain_points_mean": statistics.fmean(gains),
        # seeds are independent runs: the mean's standard error from the per-seed binomial ones
        "gain_se_points_mean": math.sqrt(sum(r["gain_se_points"] ** 2 for r in per_seed))
        / len(per_seed),
        "every_seed_positive": all(g > 0 for g in gains),
        # the held-out pass rate where `make run` (the config's loop.steps) stops, minus before
        "make_run_gain_points": [100.0 * (r["make_run_after"] - r["before"]) for r in per_seed],
        "per_seed": per_seed,
        "steps": base.loop.steps,
        "wall_s_per_seed": [r["wall_s"] for r in per_seed],
    }


def _write(args, base, per_seed: list[dict]) -> Path:
    config = {
        "config": args.config,
        "seeds": args.seeds,
        "seeds_done": [r["seed"] for r in per_seed],
        "loop": msgspec.to_builtins(base.loop),
        "trainer": msgspec.to_builtins(base.trainer),
        "warm_start": msgspec.to_builtins(base.warm_start),
        "agent_command": list(base.tasks.harness.agent_command),
    }
    return write_result("learning", config, _numbers(per_seed, base))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="examples/cpu.toml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--steps", type=int, default=16, help="RL steps N (0: the config's loop.steps)"
    )
    args = parser.parse_args()
    base = load_config(args.config)
    make_run_steps = base.loop.steps
    if (
        make_run_steps < args.steps
    ):  # also evaluate where `make run` stops: its result on every seed
        base = msgspec.structs.replace(
            base, loop=msgspec.structs.replace(base.loop, eval_every=make_run_steps)
        )
    if args.steps:
        base = msgspec.structs.replace(
            base, loop=msgspec.structs.replace(base.loop, steps=args.steps)
        )
    rows, per_seed = [], []
    for seed in args.seeds:
        run_dir = Path("runs") / f"bench-learning-seed{seed}"
        shutil.rmtree(run_dir, ignore_errors=True)
        config = msgspec.structs.replace(base, run_dir=str(run_dir), seed=seed)
        t0 = time.perf_counter()
        run(config)
        wall_s = time.perf_counter() - t0
        evals = [r for r in read_metrics(run_dir) if isinstance(r, EvalMetrics)]
        before, after = evals[0], evals[-1]
        at_make_run = next((e for e in evals if e.step == make_run_steps), after)
        gain = 100.0 * (after.pass_rate - before.pass_rate)
        se_before, se_after = (
            binomial_se(before.pass_rate, before.executions),
            binomial_se(after.pass_rate, after.executions),
        )
        per_seed.append(
            {
                "seed": seed,
                "before": before.pass_rate,
                "after": after.pass_rate,
                "gain_points": gain,
                "gain_se_points": 100.0 * math.hypot(se_before, se_after),
                "before_se": se_before,
                "after_se": se_after,
                "steps": after.step,
                "eval_executions": after.executions,
                "wall_s": wall_s,
                "make_run_steps": at_make_run.step,
                "make_run_after": at_make_run.pass_rate,
            }
        )
        rows.append(per_seed[-1])
        path = _write(
            args, base, per_seed
        )  # after every seed: a bench stopped early keeps the seeds it finished
    numbers = _numbers(per_seed, base)
    print_table("held-out pass rate before / after RL", rows)
    print(
        f"mean gain {numbers['gain_points_mean']:.1f} "
        f"+- {numbers['gain_se_points_mean']:.1f} points; wrote {path}"
    )


if __name__ == "__main__":
    main()
