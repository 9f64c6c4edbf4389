"""Gantt-style PNG of a run timeline, for the simulator and the run report alike.

Owns `plot_timeline`: one row per cell with its intervals coloured by kind, the water level and
the rollout capacity underneath. Reads only a `gyre.runtime.timeline.Timeline`; knows nothing
about whether it was simulated or recorded. Uses matplotlib's object API (no pyplot state).
"""

from __future__ import annotations

from pathlib import Path

from gyre.runtime.timeline import Timeline

__all__ = ["COLOURS", "plot_timeline"]

COLOURS = {
    "rollout": "#9ecae1",
    "switch": "#969696",
    "train": "#fd8d3c",
    "load": "#9e9ac8",
    "step": "#d62728",
    "idle": "#f0f0f0",
}
"""Colour of each interval kind; `idle` joins the legend only when the timeline has one."""


def plot_timeline(
    timeline: Timeline,
    num_cells: int,
    path: str | Path,
    title: str = "",
    *,
    time_unit_s: float = 3600.0,
    time_label: str = "simulated hours",
) -> Path:
    """Write a Gantt-style PNG of `timeline` to `path` and return it.

    Args:
        timeline: intervals (seconds) and the water level / rollout capacity steps.
        num_cells: rows drawn (cells 0 .. num_cells - 1).
        path: PNG file; its folder is created.
        title: figure title.
        time_unit_s: seconds per unit of the x axis (3600: hours, 1: seconds).
        time_label: x-axis label.

    Raises `ValueError` for num_cells < 1, time_unit_s <= 0 or an interval of an unknown kind.
    """
    if num_cells < 1:
        raise ValueError(f"num_cells={num_cells} must be >= 1")
    if not time_unit_s > 0:
        raise ValueError(f"time_unit_s={time_unit_s} must be > 0")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(14, 3 + 0.25 * num_cells))
    FigureCanvasAgg(fig)
    ax, ax_w = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    by_kind: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for iv in timeline.intervals:
        if iv.kind not in COLOURS:
            raise ValueError(f"interval kind {iv.kind!r} is not one of {tuple(COLOURS)}")
        by_kind.setdefault((iv.cell, iv.kind), []).append(
            (iv.start_s / time_unit_s, (iv.end_s - iv.start_s) / time_unit_s)
        )
    layer = {
        kind: i for i, kind in enumerate(("idle", "rollout", "switch", "train", "load", "step"))
    }
    for (cell, kind), spans in sorted(by_kind.items(), key=lambda item: layer[item[0][1]]):
        # loads and steps overlay the rollout or training span they interrupt
        ax.broken_barh(spans, (cell - 0.4, 0.8), facecolors=COLOURS[kind], linewidth=0)
    ax.set_ylabel("cell")
    ax.set_ylim(-0.6, num_cells - 0.4)
    ax.set_yticks(range(num_cells))
    ax.invert_yaxis()
    kinds = [k for k in COLOURS if k != "idle" or any(kind == "idle" for _, kind in by_kind)]
    ax.legend(
        [Rectangle((0, 0), 1, 1, color=COLOURS[k]) for k in kinds],
        kinds,
        loc="lower left",
        bbox_to_anchor=(0.0, 1.02),
        ncol=len(kinds),
        fontsize=8,
        frameon=False,
    )
    ax.set_title(title)
    t = [x / time_unit_s for x in timeline.water_t_s]
    ax_w.step(t, timeline.water_level, where="post", label="water level", linewidth=0.8)
    ax_w.step(t, timeline.rollout_capacity, where="post", label="rollout capacity", linewidth=0.8)
    ax_w.set_xlabel(time_label)
    ax_w.set_ylabel("executions")
    ax_w.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
