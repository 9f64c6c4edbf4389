"""Compare scheduler policies on one simulated scenario: build them, search Async's split, report.

Owns `build_policy`, `best_async`, `compare` (the three policies on one config, same workload
draws), `Comparison`, `format_table` and `plot_timeline` (a Gantt-style PNG per policy with the
water level and rollout capacity underneath, drawn with matplotlib). Knows nothing about event
handling; it calls `gyre.sim.engine.simulate`.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from gyre.runtime.scheduler import SchedulerPolicy, make_policy
from gyre.sim.config import SimConfig
from gyre.sim.engine import SimResult, Workload, simulate

__all__ = ["Comparison", "build_policy", "best_async", "compare", "format_table", "plot_timeline"]


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
    """The runtime policy object `name` configured from `config.policies` and `config.costs`."""
    p, c = config.policies, config.costs
    staleness = p.elastic_max_staleness_steps if name == "elastic" else p.async_max_staleness_steps
    return make_policy(
        name, max_staleness_steps=staleness, async_train_cells=async_train_cells,
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
    split, splits = 1, {}
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


_COLOURS = {
    "rollout": "#9ecae1",
    "switch": "#969696",
    "train": "#fd8d3c",
    "load": "#9e9ac8",
    "step": "#d62728",
}


def plot_timeline(result: SimResult, num_cells: int, path: str | Path, title: str = "") -> Path:
    """Write a Gantt-style PNG of `result`: one row per cell, water level and capacity below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax, ax_w) = plt.subplots(
        2, 1, figsize=(14, 3 + 0.25 * num_cells), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    by_kind: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for iv in result.timeline.intervals:
        by_kind.setdefault((iv.cell, iv.kind), []).append(
            (iv.start_s / 3600, (iv.end_s - iv.start_s) / 3600)
        )
    for (cell, kind), spans in by_kind.items():
        ax.broken_barh(spans, (cell - 0.4, 0.8), facecolors=_COLOURS[kind], linewidth=0)
    ax.set_ylabel("cell")
    ax.set_ylim(-0.6, num_cells - 0.4)
    ax.invert_yaxis()
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in _COLOURS.values()]
    ax.legend(
        handles,
        list(_COLOURS),
        loc="lower left",
        bbox_to_anchor=(0.0, 1.02),
        ncol=5,
        fontsize=8,
        frameon=False,
    )
    ax.set_title(
        title
        or f"{result.policy}: makespan {result.makespan_s / 3600:.2f} h, "
        f"utilisation {result.utilisation:.2f}"
    )
    t = [x / 3600 for x in result.timeline.water_t_s]
    ax_w.step(t, result.timeline.water_level, where="post", label="water level", linewidth=0.8)
    ax_w.step(
        t, result.timeline.rollout_capacity, where="post", label="rollout capacity", linewidth=0.8
    )
    ax_w.set_xlabel("simulated hours")
    ax_w.set_ylabel("executions")
    ax_w.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
