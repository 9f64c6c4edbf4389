"""Cluster simulator benchmark: elastic vs async (best split) vs colocate at the published scale.

Runs the shipped scenarios `examples/sim/122b-longtail.toml` and `examples/sim/2.4t-capped.toml`
over several workload seeds, the two published ablations on the 122B workload (streaming added to
Async, whose unstreamed batch is AReaL's first finished groups; Elastic over Colocate with
streaming, i.e. partial rollouts at Elastic's staleness bound: stragglers are suspended through
the training phase and carried over), and times the simulator itself on 48 steps x 64 cells.
Writes `benchmarks/results/sim.json`: each headline key is the median over seeds, and
`spread` holds min / median / max. Published numbers (docs/notes/anchors.md §0) are
printed next to ours; nothing here is tuned towards them.

Run: .venv/bin/python -m benchmarks.bench_sim [--seeds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import msgspec

from benchmarks.common import print_table, summarize, write_result
from gyre.sim import (
    Comparison,
    SimConfig,
    Workload,
    best_async,
    build_policy,
    compare,
    load_sim_config,
    simulate,
)

ROOT = Path(__file__).resolve().parents[1]

PUBLISHED = {
    "speedup_vs_async_122b": "1.38-1.57",
    "speedup_vs_colocate_122b": "1.36-1.85",
    "speedup_vs_async_24t": "1.78",
    "speedup_vs_colocate_24t": "1.21",
    "streaming_only_saving": "0.116",
    "elastic_over_colocate_streaming": "1.19",
    "utilisation_elastic_122b": ">= 0.80 (goal G4)",
    "sim_48x64_s": "< 10 (goal)",
}


def with_seed(config: SimConfig, seed: int, **policies: object) -> SimConfig:
    data = msgspec.to_builtins(config)
    data["workload"]["seed"] = seed
    data["policies"].update(policies)
    return msgspec.convert(data, SimConfig)


def scaled(config: SimConfig, num_cells: int) -> SimConfig:
    """Same workload per cell on `num_cells` cells (batch grows with the cluster)."""
    data = msgspec.to_builtins(config)
    data["cluster"]["num_cells"] = num_cells
    data["workload"]["batch_executions"] = num_cells * config.capacity_per_cell()
    return msgspec.convert(data, SimConfig)


def replaced(config: SimConfig, **sections: dict[str, object]) -> SimConfig:
    """Copy of `config` with some fields of some sections replaced (validated again)."""
    data = msgspec.to_builtins(config)
    for section, values in sections.items():
        data[section].update(values)
    return msgspec.convert(data, SimConfig)


def ratios(comp: Comparison) -> dict[str, float]:
    return {
        "speedup_vs_async": comp.speedup("async"),
        "speedup_vs_colocate": comp.speedup("colocate"),
        "utilisation_elastic": comp.results["elastic"].utilisation,
        "async_train_cells": float(comp.async_train_cells),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="workload seeds per scenario")
    args = parser.parse_args()
    seeds = list(range(args.seeds))
    c122 = load_sim_config(ROOT / "examples/sim/122b-longtail.toml")
    c24 = load_sim_config(ROOT / "examples/sim/2.4t-capped.toml")

    samples: dict[str, list[float]] = {k: [] for k in PUBLISHED}
    detail: dict[str, dict[str, list[float]]] = {"122b": {}, "24t": {}}
    for seed in seeds:
        for tag, base in (("122b", c122), ("24t", c24)):
            comp = compare(with_seed(base, seed))
            samples[f"speedup_vs_async_{tag}"].append(comp.speedup("async"))
            samples[f"speedup_vs_colocate_{tag}"].append(comp.speedup("colocate"))
            d = detail[tag]
            for name, r in comp.results.items():
                d.setdefault(f"makespan_h_{name}", []).append(r.makespan_s / 3600)
                d.setdefault(f"utilisation_{name}", []).append(r.utilisation)
                d.setdefault(f"bound_h_{name}", []).append(r.lower_bound_s / 3600)
            d.setdefault("async_train_cells", []).append(comp.async_train_cells)
            d.setdefault("elastic_max_staleness_steps", []).append(
                comp.results["elastic"].max_staleness_steps
            )
            if tag == "122b":
                samples["utilisation_elastic_122b"].append(comp.results["elastic"].utilisation)
                # Ablation 1: streaming added to Async (each with its own best split).
                _, streamed, _ = best_async(with_seed(base, seed, async_streaming=True))
                samples["streaming_only_saving"].append(
                    1 - streamed.makespan_s / comp.results["async"].makespan_s
                )
                d.setdefault("makespan_h_async_streaming", []).append(streamed.makespan_s / 3600)
                # The same saving over an Async whose batch is its own dispatched groups (the
                # node runtime's non-streaming mode): stragglers then hold the step.
                _, own, _ = best_async(with_seed(base, seed, unstreamed_batch="dispatched"))
                d.setdefault("makespan_h_async_dispatched_batches", []).append(
                    own.makespan_s / 3600
                )
                d.setdefault("streaming_saving_over_dispatched_batches", []).append(
                    1 - streamed.makespan_s / own.makespan_s
                )
                # Ablation 2: Elastic over Colocate + streaming (partial rollouts, Elastic's k).
                cfg = with_seed(
                    base,
                    seed,
                    colocate_streaming=True,
                    colocate_max_staleness_steps=base.policies.elastic_max_staleness_steps,
                )
                colo = simulate(cfg, build_policy(cfg, "colocate"), Workload(cfg))
                samples["elastic_over_colocate_streaming"].append(
                    colo.makespan_s / comp.results["elastic"].makespan_s
                )
                d.setdefault("makespan_h_colocate_streaming", []).append(colo.makespan_s / 3600)
                d.setdefault("utilisation_colocate_streaming", []).append(colo.utilisation)
                d.setdefault("suspensions_colocate_streaming", []).append(colo.suspensions)

    # Sensitivity on the 122B workload (seed 0): tail width, switch cost, cell granularity.
    sweeps: dict[str, dict[str, dict[str, float]]] = {"sigma": {}, "switch_cost_x": {}}
    for sigma in (0.0, 0.5, 1.0, 1.5):
        comp = compare(replaced(c122, workload={"sigma": sigma}))
        sweeps["sigma"][str(sigma)] = ratios(comp)
    for factor in (1, 30, 300):
        costs = {"switch_to_train_s": 8.52 * factor, "switch_to_rollout_s": 3.46 * factor}
        sweeps["switch_cost_x"][str(factor)] = ratios(compare(replaced(c122, costs=costs)))
    # Halving cells (32 cells of half the FLOPs and KV) with the same total hardware and batch.
    halved = replaced(
        c122,
        cluster={
            "num_cells": 32,
            "cell_peak_flops_per_s": c122.cluster.cell_peak_flops_per_s / 2,
            "kv_cache_bytes_per_cell": c122.cluster.kv_cache_bytes_per_cell / 2,
        },
        policies={"compare": ["elastic"]},
    )
    whole = simulate(c122, build_policy(c122, "elastic", 1), Workload(c122))
    half = simulate(halved, build_policy(halved, "elastic", 1), Workload(halved))
    sweeps["cell_halving_change"] = {"elastic": half.makespan_s / whole.makespan_s - 1}
    # Streaming's saving grows with training's share of a step: the 122B config assumes every
    # layer is full attention (the T^2 upper bound); a 3:1 hybrid has a quarter of them.
    sweeps["streaming_saving_by_full_attention_layers"] = {}
    for layers in (c122.model.num_layers, c122.model.num_layers // 4):
        cfg = replaced(c122, model={"num_layers": layers})
        _, plain, _ = best_async(cfg)
        _, streamed, _ = best_async(replaced(cfg, policies={"async_streaming": True}))
        sweeps["streaming_saving_by_full_attention_layers"][str(layers)] = (
            1 - streamed.makespan_s / plain.makespan_s
        )
    # Staleness bound k shared by Elastic and Colocate + streaming (partial rollouts).
    sweeps["staleness_k"] = {}
    for k in (1, 2):
        cfg = replaced(
            c122,
            policies={
                "elastic_max_staleness_steps": k,
                "colocate_max_staleness_steps": k,
                "colocate_streaming": True,
            },
        )
        el = simulate(cfg, build_policy(cfg, "elastic", 1), Workload(cfg))
        co = simulate(cfg, build_policy(cfg, "colocate"), Workload(cfg))
        sweeps["staleness_k"][str(k)] = {
            "elastic_over_colocate_streaming": co.makespan_s / el.makespan_s,
            "utilisation_elastic": el.utilisation,
            "utilisation_colocate_streaming": co.utilisation,
        }

    # Speed of the simulator itself: 48 steps on 64 cells, elastic (the policy with most decisions).
    big = scaled(c122, 64)
    for _ in range(3):
        t0 = time.perf_counter()
        r = simulate(big, build_policy(big, "elastic", 16))
        samples["sim_48x64_s"].append(time.perf_counter() - t0)
    assert len(r.step_end_s) == 48

    numbers: dict[str, object] = {k: statistics.median(v) for k, v in samples.items()}
    numbers["spread"] = {k: summarize(v) for k, v in samples.items()}
    numbers["scenarios"] = {
        tag: {k: summarize([float(x) for x in v]) for k, v in d.items()}
        for tag, d in detail.items()
    }
    numbers["sweeps_122b_seed0"] = sweeps
    numbers["published"] = PUBLISHED
    config = {
        "seeds": seeds,
        "122b": msgspec.to_builtins(c122),
        "24t": msgspec.to_builtins(c24),
        "sim_48x64": {
            "num_cells": 64,
            "batch_executions": big.workload.batch_executions,
            "policy": "elastic",
        },
    }
    path = write_result("sim", config, numbers)
    rows = [
        {
            "key": k,
            "ours_median": numbers[k],
            "min": s["min"],
            "max": s["max"],
            "published": PUBLISHED[k],
        }
        for k, s in ((k, summarize(v)) for k, v in samples.items())
    ]
    print_table(f"bench_sim ({len(seeds)} seeds) -> {path.relative_to(ROOT)}", rows)
    sweep_rows = [
        {"sweep": name, "value": value, **r}
        for name in ("sigma", "switch_cost_x")
        for value, r in sweeps[name].items()
    ]
    print_table("122B sensitivity (seed 0)", sweep_rows)
    print(f"cell halving (32 half cells vs 16): {sweeps['cell_halving_change']['elastic']:+.3f}")
    for k, r in sweeps["staleness_k"].items():
        ratio = r["elastic_over_colocate_streaming"]
        print(f"k = {k}: elastic over colocate + streaming {ratio:.3f}")
    for layers, saving in sweeps["streaming_saving_by_full_attention_layers"].items():
        print(f"streaming saving with {layers} full-attention layers: {saving:.3f}")
    own = numbers["scenarios"]["122b"]["streaming_saving_over_dispatched_batches"]["median"]
    print(f"streaming saving over an Async with dispatched batches: {own:.3f}")


if __name__ == "__main__":
    main()
