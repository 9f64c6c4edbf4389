"""Compare scheduler policies on one simulated scenario: build them, search Async's split, report.

Owns `build_policy`, `best_async`, `compare` (the three policies on one config, same workload
draws), `Comparison` and `format_table`. Knows nothing about event handling (it calls
`gyre.sim.engine.simulate`) or plotting (`gyre.report.gantt.plot_timeline` draws a result's
timeline).
"""

from __future__ import annotations

import msgspec

from gyre.runtime.scheduler import SchedulerPolicy, make_policy
from gyre.sim.config import SimConfig
from gyre.sim.engine import SimResult, Workload, simulate

__all__ = ["Comparison", "build_policy", "best_async", "compare", "format_table"]


class Comparison(msgspec.Struct, frozen=True, kw_only=True):
    """Results of the policies on one config; `async_splits`: training cells -> makespan_s."""

    config: SimConfig
    results: dict[str, SimResult]
    async_train_cells: int = 0
    """Training cells of the Async split reported in `results["async"]`."""
    async_splits: dict[int, float] = {}

    def speedup(self, over: str, of: str = "elastic") -> float:
        """makespan(over) / makespan(of): > 1 means `of` finished sooner."""
        return self.results[over].makespan_s / self.results[of].makespan_s


def build_policy(config: SimConfig, name: str, async_train_cells: int = 1) -> SchedulerPolicy:
    """The runtime policy object `name` configured from `config.policies` and `config.costs`
    (`make_policy`, as the node runtime builds it)."""
    p, c = config.policies, config.costs
    staleness = {
        "colocate": p.colocate_max_staleness_steps,
        "elastic": p.elastic_max_staleness_steps,
        "async": p.async_max_staleness_steps,
    }.get(name, 0)
    return make_policy(
        name,
        max_staleness_steps=staleness,
        async_train_cells=async_train_cells,
        switch_cost_s=c.switch_to_train_s + c.switch_to_rollout_s,
    )


def best_async(
    config: SimConfig, workload: Workload | None = None
) -> tuple[int, SimResult, dict[int, float]]:
    """Search every fixed split (1 .. num_cells - 1 training cells); the fastest wins.

    With `policies.async_num_train_cells > 0` only that split runs.
    """
    workload = workload or Workload(config)
    fixed = config.policies.async_num_train_cells
    splits = [fixed] if fixed else range(1, config.cluster.num_cells)
    results = {t: simulate(config, build_policy(config, "async", t), workload) for t in splits}
    best = min(results, key=lambda t: results[t].makespan_s)
    return best, results[best], {t: r.makespan_s for t, r in results.items()}


def compare(config: SimConfig) -> Comparison:
    """Run the policies named in `config.policies.compare` on the same workload draws."""
    workload = Workload(config)
    results: dict[str, SimResult] = {}
    split = 1
    splits: dict[int, float] = {}
    names = config.policies.compare
    if "async" in names or "elastic" in names:
        split, results_async, splits = best_async(config, workload)
        if "async" in names:
            results["async"] = results_async
    for name in names:
        if name != "async":
            results[name] = simulate(config, build_policy(config, name, split), workload)
    return Comparison(config=config, results=results, async_train_cells=split, async_splits=splits)


def format_table(comp: Comparison) -> str:
    """Aligned text table: one row per policy, times in hours."""
    head = (
        "policy",
        "makespan_h",
        "step_h_median",
        "bound_h",
        "utilisation",
        "switches",
        "staleness",
        "vs_this",
    )
    rows = [head]
    ref = comp.results.get("elastic")
    for name, r in comp.results.items():
        steps = [b - a for a, b in zip((0.0, *r.step_end_s), r.step_end_s, strict=False)]
        steps.sort()
        label = f"async({comp.async_train_cells} train)" if name == "async" else name
        rows.append(
            (
                label,
                f"{r.makespan_s / 3600:.2f}",
                f"{steps[len(steps) // 2] / 3600:.3f}",
                f"{r.lower_bound_s / 3600:.2f}",
                f"{r.utilisation:.3f}",
                str(r.switches),
                str(r.max_staleness_steps),
                f"{r.makespan_s / ref.makespan_s:.3f}x" if ref else "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [
        f"{comp.config.name}: {comp.config.cluster.num_cells} cells, "
        f"{comp.config.workload.num_steps} steps, {comp.config.capacity_per_cell()} executions "
        "per rollout cell (vs_this = makespan / elastic's)"
    ]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)
