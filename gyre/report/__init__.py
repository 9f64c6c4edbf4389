"""Run report: PNG plots and a one-page markdown summary of `<run_dir>/metrics.jsonl`.

Owns `RunSummary` (the numbers of the page, computed by `summarize`), `write_report` (plots +
`<run_dir>/report/summary.md`) and the three plots: pass rate and mean reward per step with the
held-out evaluations overlaid, the rollout/train/sync time split per step, and the off-policy
logprob mismatch per step. When the run recorded a timeline (`<run_dir>/timeline.jsonl`), it
also draws the cells' Gantt chart (`timeline.png`, `gyre.report.gantt`) and adds cell
utilisation per step to the page. Reads only `gyre.runtime.metrics` and `gyre.runtime.timeline`
records; knows nothing about how they were produced. A step recorded twice (a run killed after writing a step and resumed before
its checkpoint) counts once, with its last record. Plots use matplotlib's object API (no pyplot
state, no display needed).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import msgspec

from gyre.report.gantt import plot_timeline
from gyre.runtime.metrics import EvalMetrics, StepMetrics, read_metrics
from gyre.runtime.timeline import (
    TIMELINE_FILE,
    Timeline,
    read_timeline,
    utilisation,
    utilisation_per_step,
)

__all__ = [
    "RunSummary", "summarize", "write_report", "utilisation_table", "REPORT_DIR", "PLOTS", "TIMELINE_PLOT",
]

REPORT_DIR = "report"
"""Folder under the run directory that `write_report` fills."""
PLOTS = ("pass_rate.png", "time_split.png", "mismatch.png")
"""File names of the plots, in the order the summary shows them."""
TIMELINE_PLOT = "timeline.png"
"""The cells' Gantt chart, drawn when the run has a `timeline.jsonl`."""


class RunSummary(msgspec.Struct, frozen=True, kw_only=True):
    """The numbers of a run's one-page summary. Rates are fractions in [0, 1]; times in seconds."""

    steps: int
    """Distinct RL steps recorded."""
    first_step: int | None
    last_step: int | None
    wall_s: float
    """Sum of step wall times (`step_s`) and evaluation times (`eval_s`)."""
    rollout_s: float
    train_s: float
    sync_s: float
    eval_s: float
    """Sum of evaluation times."""
    executions: int
    """Training executions over all steps (evaluations not counted)."""
    finished: int
    partial: int
    """Executions stopped at a deadline and partially scored, over all steps."""
    failed: int
    """Executions failed for infrastructure reasons, over all steps."""
    skipped_steps: int
    """Steps whose optimizer update was not applied."""
    policy_tokens: int
    """Tokens that carried loss, over all steps."""
    mean_dedup_ratio: float
    """Mean over steps of the per-step dedup ratio; NaN with no steps."""
    mean_logprob_abs_diff: float
    """Mean over steps of the behaviour-vs-trainer mismatch; NaN with no steps."""
    max_logprob_abs_diff: float
    """Largest per-step mean mismatch; NaN with no steps."""
    eval_split: str | None
    """Split used for before/after: `heldout` when there is one, else `train`, else None."""
    pass_before: float | None
    """Pass rate of the earliest evaluation (step 0 = before RL) of `eval_split`."""
    pass_before_step: int | None
    pass_after: float | None
    """Pass rate of the latest evaluation of `eval_split`; None unless there are two or more."""
    pass_after_step: int | None
    best_eval_pass: float | None
    """Highest evaluation pass rate of `eval_split` and the step it was measured at (earliest on ties)."""
    best_eval_step: int | None
    best_step: int | None
    """Step with the highest batch pass rate (earliest on ties)."""
    best_step_pass: float | None


def _split(records: list) -> tuple[list[StepMetrics], list[EvalMetrics]]:
    by_step: dict[int, StepMetrics] = {}
    evals: dict[tuple[int, str], EvalMetrics] = {}
    for r in records:
        if isinstance(r, StepMetrics):
            by_step[r.step] = r
        else:
            evals[(r.step, r.split)] = r
    return [by_step[k] for k in sorted(by_step)], [evals[k] for k in sorted(evals)]


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else math.nan


def summarize(records: list[StepMetrics | EvalMetrics]) -> RunSummary:
    """The summary numbers of a run's records (as `read_metrics` returns them).

    Duplicate step numbers keep the last record; duplicate (step, split) evaluations likewise.
    """
    steps, evals = _split(records)
    splits = {e.split for e in evals}
    split = "heldout" if "heldout" in splits else ("train" if "train" in splits else None)
    chosen = [e for e in evals if e.split == split]
    best_eval = max(chosen, key=lambda e: (e.pass_rate, -e.step)) if chosen else None
    best = max(steps, key=lambda s: (s.pass_rate, -s.step)) if steps else None
    return RunSummary(
        steps=len(steps),
        first_step=steps[0].step if steps else None,
        last_step=steps[-1].step if steps else None,
        wall_s=sum(s.step_s for s in steps) + sum(e.eval_s for e in evals),
        rollout_s=sum(s.rollout_s for s in steps),
        train_s=sum(s.train_s for s in steps),
        sync_s=sum(s.sync_s for s in steps),
        eval_s=sum(e.eval_s for e in evals),
        executions=sum(s.executions for s in steps),
        finished=sum(s.finished for s in steps),
        partial=sum(s.partial for s in steps),
        failed=sum(s.failed for s in steps),
        skipped_steps=sum(not s.applied for s in steps),
        policy_tokens=sum(s.policy_tokens for s in steps),
        mean_dedup_ratio=_mean([s.dedup_ratio for s in steps]),
        mean_logprob_abs_diff=_mean([s.logprob_abs_diff_mean for s in steps]),
        max_logprob_abs_diff=max((s.logprob_abs_diff_mean for s in steps), default=math.nan),
        eval_split=split,
        pass_before=chosen[0].pass_rate if chosen else None,
        pass_before_step=chosen[0].step if chosen else None,
        pass_after=chosen[-1].pass_rate if len(chosen) > 1 else None,
        pass_after_step=chosen[-1].step if len(chosen) > 1 else None,
        best_eval_pass=best_eval.pass_rate if best_eval else None,
        best_eval_step=best_eval.step if best_eval else None,
        best_step=best.step if best else None,
        best_step_pass=best.pass_rate if best else None,
    )


# --------------------------------------------------------------------------------------------
# plots


def _figure(width: float = 8.0, height: float = 4.5):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _plot_pass_rate(steps: list[StepMetrics], evals: list[EvalMetrics], path: Path) -> None:
    fig = _figure()
    ax = fig.add_subplot()
    x = [s.step for s in steps]
    ax.plot(x, [s.pass_rate for s in steps], "o-", color="tab:blue", label="pass rate (batch)")
    ax.plot(x, [s.mean_reward for s in steps], "s--", color="tab:orange", label="mean reward (batch)")
    styles = {"heldout": ("D", "tab:red", "held-out pass rate"), "train": ("^", "tab:green", "train-split eval pass rate")}
    for split, (marker, color, label) in styles.items():
        es = [e for e in evals if e.split == split]
        if es:
            ax.plot([e.step for e in es], [e.pass_rate for e in es], marker=marker, linestyle=":",
                    color=color, markersize=8, label=label)
            for e in es:
                ax.annotate(f"{100 * e.pass_rate:.0f}%", (e.step, e.pass_rate), textcoords="offset points",
                            xytext=(0, 8), ha="center", fontsize=8, color=color)
    ax.set_xlabel("RL step")
    ax.set_ylabel("fraction")
    ax.set_ylim(-0.05, 1.1)
    ax.set_title("Pass rate and mean reward per step")
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower center", ncols=4, fontsize=8)
    _integer_ticks(ax)
    fig.savefig(path)


def _plot_time_split(steps: list[StepMetrics], path: Path) -> None:
    fig = _figure()
    ax = fig.add_subplot()
    x = [s.step for s in steps]
    bottom = [0.0] * len(steps)
    parts = [
        ("rollout", [s.rollout_s for s in steps], "tab:blue"),
        ("train", [s.train_s for s in steps], "tab:orange"),
        ("sync", [s.sync_s for s in steps], "tab:green"),
        ("other", [max(s.step_s - s.rollout_s - s.train_s - s.sync_s, 0.0) for s in steps], "tab:gray"),
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


def _plot_mismatch(steps: list[StepMetrics], path: Path) -> None:
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
    ratio_ax.plot(x, [s.mean_ratio for s in steps], "x--", color="tab:gray", label="mean importance ratio")
    ratio_ax.set_ylabel("mean importance ratio")
    ratio_ax.ticklabel_format(axis="y", useOffset=False)
    fig.legend(loc="outside lower center", ncols=2, fontsize=8)
    _integer_ticks(ax)
    fig.savefig(path)


def _integer_ticks(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


# --------------------------------------------------------------------------------------------
# summary page


def _pct(x: float | None) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:.1f}%"


def _duration(s: float) -> str:
    m, sec = divmod(round(s), 60)
    h, m = divmod(m, 60)
    return f"{h}h {m:02d}m {sec:02d}s" if h else f"{m}m {sec:02d}s"


def _markdown(run_dir: Path, s: RunSummary) -> str:
    def share(part: float) -> str:
        return f"{100 * part / s.wall_s:.0f}%" if s.wall_s > 0 else "n/a"

    if s.pass_before is not None and s.pass_after is not None:
        change = f"{100 * (s.pass_after - s.pass_before):+.1f} points"
    else:
        change = "n/a"
    split = s.eval_split or "none"
    rows = [
        ("steps", f"{s.steps}" + (f" ({s.first_step}-{s.last_step})" if s.steps else "")),
        ("time in steps + evaluations", f"{_duration(s.wall_s)} (rollout {share(s.rollout_s)}, train {share(s.train_s)}, "
                      f"sync {share(s.sync_s)}, evaluation {share(s.eval_s)})"),
        (f"pass rate before ({split})", _pct(s.pass_before) + (f" at step {s.pass_before_step}" if s.pass_before_step is not None else "")),
        (f"pass rate after ({split})", _pct(s.pass_after) + (f" at step {s.pass_after_step}" if s.pass_after_step is not None else "")),
        ("change", change),
        (f"best evaluation ({split})", _pct(s.best_eval_pass) + (f" at step {s.best_eval_step}" if s.best_eval_step is not None else "")),
        ("best step (batch pass rate)", f"{s.best_step} ({_pct(s.best_step_pass)})" if s.best_step is not None else "n/a"),
        ("training executions", f"{s.executions} (finished {s.finished}, partially scored {s.partial}, failed {s.failed})"),
        ("policy tokens trained", f"{s.policy_tokens:,}"),
        ("mean dedup ratio", "n/a" if math.isnan(s.mean_dedup_ratio) else f"{s.mean_dedup_ratio:.2f}x"),
        ("logprob mismatch (mean / worst step)", "n/a" if math.isnan(s.mean_logprob_abs_diff)
         else f"{s.mean_logprob_abs_diff:.2e} / {s.max_logprob_abs_diff:.2e} nats"),
        ("skipped optimizer steps", f"{s.skipped_steps}"),
    ]
    lines = [f"# Run report: `{run_dir}`", "", "| | |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    lines += ["", "![pass rate and mean reward per step](pass_rate.png)", "",
              "![time split per step](time_split.png)", "", "![off-policy mismatch per step](mismatch.png)", ""]
    return "\n".join(lines)


def _fraction(x: float | None) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:.1f}%"


def utilisation_table(timeline: Timeline, num_cells: int) -> str:
    """Markdown table of cell utilisation per RL step and over the whole timeline.

    One row per step window of `utilisation_per_step` (from 0 s) and a last row `all` over
    [0, the latest interval end]: the window in seconds, `busy` and `slot_fill` as percentages
    (one decimal) and the cell-seconds of rollout, train, step, load, switch and idle.
    """
    kinds = ("rollout", "train", "step", "load", "switch", "idle")
    head = "| step | window (s) | busy | slot fill | " + " | ".join(f"{k} (cell-s)" for k in kinds) + " |"
    lines = [head, "|" + " --- |" * (4 + len(kinds))]

    def row(label: str, u) -> str:
        cells = " | ".join(f"{u.cell_s_by_kind.get(k, 0.0):.1f}" for k in kinds)
        return (f"| {label} | {u.start_s:.1f}-{u.end_s:.1f} | {_fraction(u.busy)} | {_fraction(u.slot_fill)} | "
                f"{cells} |")

    for s in utilisation_per_step(timeline, num_cells):
        lines.append(row(str(s.step), s.utilisation))
    end = max((iv.end_s for iv in timeline.intervals), default=0.0)
    if end > 0:
        lines.append(row("all", utilisation(timeline, num_cells, 0.0, end)))
    return "\n".join(lines)


def _timeline_section(run_dir: Path, out: Path) -> str:
    timeline = read_timeline(run_dir)
    num_cells = max(timeline.num_cells, 1)
    end = max((iv.end_s for iv in timeline.intervals), default=0.0)
    unit_s, label = (1.0, "seconds") if end <= 600 else ((60.0, "minutes") if end <= 3 * 3600 else (3600.0, "hours"))
    plot_timeline(timeline, num_cells, out / TIMELINE_PLOT, title=f"{num_cells} cells",
                  time_unit_s=unit_s, time_label=f"{label} since the run started")
    return "\n".join([
        "## Cells", "",
        "Utilisation by slots: a cell is busy while it holds work (a rollout cell hosting an execution, a "
        "training cell computing, the optimizer step); slot fill = executions running / rollout slots.", "",
        utilisation_table(timeline, num_cells), "",
        f"![cell timeline]({TIMELINE_PLOT})", "",
    ])


def write_report(run_dir: str | os.PathLike[str]) -> Path:
    """Write `<run_dir>/report/` (`summary.md` and the `PLOTS`) from `<run_dir>/metrics.jsonl`.

    When `<run_dir>/timeline.jsonl` exists, also `TIMELINE_PLOT` and a utilisation table per
    step (`utilisation_table`) on the page. Returns the path of `summary.md`. Raises
    `FileNotFoundError` when the run has no metrics file. A run with no step yet still gets a
    page (with n/a) and empty plots.
    """
    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    steps, evals = _split(records)
    out = run_dir / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    _plot_pass_rate(steps, evals, out / PLOTS[0])
    _plot_time_split(steps, out / PLOTS[1])
    _plot_mismatch(steps, out / PLOTS[2])
    page = _markdown(run_dir, summarize(records))
    if (run_dir / TIMELINE_FILE).exists():
        page += "\n" + _timeline_section(run_dir, out)
    summary = out / "summary.md"
    summary.write_text(page)
    return summary
