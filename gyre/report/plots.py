"""The run report's per-step plots, drawn with matplotlib's object API (no pyplot state).

Owns `plot_pass_rate` (pass rate and mean reward per step, held-out evaluations overlaid),
`plot_time_split` (rollout / train / sync time per step) and `plot_mismatch` (off-policy logprob
mismatch and mean importance ratio per step); each writes one PNG. The cells' Gantt chart is
`gyre.report.gantt`. Knows nothing about the summary page or how the records were produced.
"""

from __future__ import annotations

import math
from pathlib import Path

from gyre.runtime.metrics import EvalMetrics, StepMetrics

__all__ = ["plot_pass_rate", "plot_time_split", "plot_mismatch"]


def _figure(width: float = 8.0, height: float = 4.5):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def plot_pass_rate(steps: list[StepMetrics], evals: list[EvalMetrics], path: Path) -> None:
    fig = _figure()
    ax = fig.add_subplot()
    x = [s.step for s in steps]
    ax.plot(x, [s.pass_rate for s in steps], "o-", color="tab:blue", label="pass rate (batch)")
    ax.plot(
        x, [s.mean_reward for s in steps], "s--", color="tab:orange", label="mean reward (batch)"
    )
    styles = {
        "heldout": ("D", "tab:red", "held-out pass rate"),
        "train": ("^", "tab:green", "train-split eval pass rate"),
    }
    for split, (marker, color, label) in styles.items():
        es = [e for e in evals if e.split == split]
        if es:
            ax.plot(
                [e.step for e in es],
                [e.pass_rate for e in es],
                marker=marker,
                linestyle=":",
                color=color,
                markersize=8,
                label=label,
            )
            for e in es:
                ax.annotate(
                    f"{100 * e.pass_rate:.0f}%",
                    (e.step, e.pass_rate),
                    textcoords="offset points",
                    xytext=(0, 8),
                    ha="center",
                    fontsize=8,
                    color=color,
                )
    ax.set_xlabel("RL step")
    ax.set_ylabel("fraction")
    ax.set_ylim(-0.05, 1.1)
    ax.set_title("Pass rate and mean reward per step")
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower center", ncols=4, fontsize=8)
    _integer_ticks(ax)
    fig.savefig(path)


def plot_time_split(steps: list[StepMetrics], path: Path) -> None:
    fig = _figure()
    ax = fig.add_subplot()
    x = [s.step for s in steps]
    bottom = [0.0] * len(steps)
    parts = [
        ("rollout", [s.rollout_s for s in steps], "tab:blue"),
        ("train", [s.train_s for s in steps], "tab:orange"),
        ("sync", [s.sync_s for s in steps], "tab:green"),
        (
            "other",
            [max(s.step_s - s.rollout_s - s.train_s - s.sync_s, 0.0) for s in steps],
            "tab:gray",
        ),
    ]
    for label, values, color in parts:
        if label == "other" and not any(values):
            continue
        ax.bar(x, values, bottom=bottom, label=label, color=color, width=0.8)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xlabel("RL step")
    ax.set_ylabel("seconds")
    ax.set_ylim(0, 1.08 * max(bottom, default=0.0) or 1.0)  # autoscale clipped the tallest stacks
    ax.set_title("Time split per step")
    ax.grid(axis="y", alpha=0.3)
    fig.legend(loc="outside lower center", ncols=4, fontsize=8)
    _integer_ticks(ax)
    fig.savefig(path)


def plot_mismatch(steps: list[StepMetrics], path: Path) -> None:
    fig = _figure()
    ax = fig.add_subplot()
    x = [s.step for s in steps]
    diffs = [s.logprob_abs_diff_mean for s in steps]
    ax.plot(x, diffs, "o-", color="tab:purple", label="mean |trainer - behaviour| logprob")
    if any(d > 0 for d in diffs if not math.isnan(d)):
        ax.set_yscale("log")
    ax.set_xlabel("RL step")
    ax.set_ylabel("nats per loss token")
    ax.set_title("Off-policy mismatch per step")
    ax.grid(alpha=0.3, which="both")
    ratio_ax = ax.twinx()
    ratio_ax.plot(
        x, [s.mean_ratio for s in steps], "x--", color="tab:gray", label="mean importance ratio"
    )
    ratio_ax.set_ylabel("mean importance ratio")
    ratio_ax.ticklabel_format(axis="y", useOffset=False)
    fig.legend(loc="outside lower center", ncols=2, fontsize=8)
    _integer_ticks(ax)
    fig.savefig(path)


def _integer_ticks(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
