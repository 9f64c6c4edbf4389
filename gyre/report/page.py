"""The run report's page: `write_report` fills `<run_dir>/report/` with `summary.md` and the plots.

Owns `write_report`, the markdown of the page (summary, per-step table of branches, heals and
suspensions, trajectory-tree statistics), `utilisation_table` (cell utilisation per RL step, when
the run recorded a timeline), and the file names (`REPORT_DIR`, `PLOTS`, `TIMELINE_PLOT`,
`TREES_CSV`). The numbers come from `gyre.report.summary` and `gyre.report.trees`, the drawings
from `gyre.report.plots` and `gyre.report.gantt`. Reads only run-folder records (metrics,
timeline, call log); knows nothing about how they were produced.
"""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path

from gyre.report.gantt import plot_timeline
from gyre.report.plots import plot_mismatch, plot_pass_rate, plot_time_split
from gyre.report.summary import RunSummary, split_records, summarize
from gyre.report.trees import CALL_LOG, ExecutionTree, execution_trees, tree_totals
from gyre.runtime.metrics import StepMetrics, read_metrics
from gyre.runtime.timeline import (
    TIMELINE_FILE,
    Timeline,
    read_timeline,
    utilisation,
    utilisation_per_step,
)

__all__ = [
    "write_report",
    "utilisation_table",
    "steps_table",
    "trees_section",
    "REPORT_DIR",
    "PLOTS",
    "TIMELINE_PLOT",
    "TREES_CSV",
]

REPORT_DIR = "report"
"""Folder under the run directory that `write_report` fills."""
PLOTS = ("pass_rate.png", "time_split.png", "mismatch.png")
"""File names of the plots, in the order the summary shows them."""
TIMELINE_PLOT = "timeline.png"
"""The cells' Gantt chart, drawn when the run has a `timeline.jsonl`."""
TREES_CSV = "trees.csv"
"""Every execution's trajectory-tree statistics, one row each, written when the run has a call
log (the page lists the largest `TREES_SHOWN`)."""
TREES_SHOWN = 20
SUSPENSIONS_NOTE = (
    "Suspensions: executions whose cell left rollout when no rollout cell that stays had room; "
    "they waited, their calls held, until a rollout slot freed (n/a: not recorded)."
)


def _pct(x: float | None) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:.1f}%"


def _nats(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.2e} nats"


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
        (
            "time in steps + evaluations",
            f"{_duration(s.wall_s)} (rollout {share(s.rollout_s)}, train {share(s.train_s)}, "
            f"sync {share(s.sync_s)}, evaluation {share(s.eval_s)})",
        ),
        (
            f"pass rate before ({split})",
            _pct(s.pass_before)
            + (f" at step {s.pass_before_step}" if s.pass_before_step is not None else ""),
        ),
        (
            f"pass rate after ({split})",
            _pct(s.pass_after)
            + (f" at step {s.pass_after_step}" if s.pass_after_step is not None else ""),
        ),
        ("change", change),
        (
            f"best evaluation ({split})",
            _pct(s.best_eval_pass)
            + (f" at step {s.best_eval_step}" if s.best_eval_step is not None else ""),
        ),
        (
            "best step (batch pass rate)",
            f"{s.best_step} ({_pct(s.best_step_pass)})" if s.best_step is not None else "n/a",
        ),
        (
            "training executions",
            f"{s.executions} (finished {s.finished}, partially scored {s.partial}, "
            f"failed {s.failed})",
        ),
        ("policy tokens trained", f"{s.policy_tokens:,}"),
        (
            "trajectories (tree leaves) of trained executions",
            "n/a" if s.branches is None else f"{s.branches:,}",
        ),
        (
            "mean dedup ratio of training batches (selected paths / packed tokens)",
            "n/a" if math.isnan(s.mean_dedup_ratio) else f"{s.mean_dedup_ratio:.2f}x",
        ),
        (
            "logprob mismatch (mean / worst step)",
            "n/a"
            if math.isnan(s.mean_logprob_abs_diff)
            else f"{s.mean_logprob_abs_diff:.2e} / {s.max_logprob_abs_diff:.2e} nats",
        ),
        (
            "worst step's mismatch: same weight version (numerics) / stale tokens (drift)",
            f"{_nats(s.max_same_version_mismatch)} / {_nats(s.max_stale_mismatch)}",
        ),
        ("skipped optimizer steps", f"{s.skipped_steps}"),
    ]
    lines = [f"# Run report: `{run_dir}`", "", "| | |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    lines += [
        "",
        "![pass rate and mean reward per step](pass_rate.png)",
        "",
        "![time split per step](time_split.png)",
        "",
        "![off-policy mismatch per step](mismatch.png)",
        "",
    ]
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
    head = (
        "| step | window (s) | busy | slot fill | "
        + " | ".join(f"{k} (cell-s)" for k in kinds)
        + " |"
    )
    lines = [head, "|" + " --- |" * (4 + len(kinds))]

    def row(label: str, u) -> str:
        cells = " | ".join(f"{u.cell_s_by_kind.get(k, 0.0):.1f}" for k in kinds)
        return (
            f"| {label} | {u.start_s:.1f}-{u.end_s:.1f} | {_fraction(u.busy)} | "
            f"{_fraction(u.slot_fill)} | {cells} |"
        )

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
    unit_s, label = (
        (1.0, "seconds")
        if end <= 600
        else ((60.0, "minutes") if end <= 3 * 3600 else (3600.0, "hours"))
    )
    plot_timeline(
        timeline,
        num_cells,
        out / TIMELINE_PLOT,
        title=f"{num_cells} cells",
        time_unit_s=unit_s,
        time_label=f"{label} since the run started",
    )
    return "\n".join(
        [
            "## Cells",
            "",
            "Utilisation by slots: a cell is busy while it holds work (a rollout cell hosting an "
            "execution, a training cell computing, the optimizer step); slot fill = executions "
            "running / rollout slots.",
            "",
            utilisation_table(timeline, num_cells),
            "",
            f"![cell timeline]({TIMELINE_PLOT})",
            "",
        ]
    )


def steps_table(steps: list[StepMetrics]) -> str:
    """Markdown table, one row per step: executions, pass rate, model calls, branches (tree
    leaves of the trained executions), heals (calls whose history the proxy healed; n/a in
    records from before either count) and suspensions (`SUSPENSIONS_NOTE`; n/a in records from
    before they were counted)."""
    lines = [
        "| step | executions | pass rate | model calls | branches | heals | suspensions |",
        "|" + " --- |" * 7,
    ]
    for s in steps:
        branches = "n/a" if s.branches < 0 else str(s.branches)
        heals = "n/a" if s.heals < 0 else str(s.heals)
        suspensions = "n/a" if s.suspensions < 0 else str(s.suspensions)
        lines.append(
            f"| {s.step} | {s.executions} | {_pct(s.pass_rate)} | {s.model_calls} | "
            f"{branches} | {heals} | {suspensions} |"
        )
    return "\n".join(lines)


def _ratio(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.2f}x"


def _reasons(divergences: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in divergences.items()) or "none"


def trees_section(trees: list[ExecutionTree]) -> str:
    """Markdown of the run's trajectory trees: totals over executions (dedup ratio = tokens in
    calls / unique tokens, summed and per execution), then the `TREES_SHOWN` executions with the
    most tokens in calls."""
    t = tree_totals(trees)
    rows = [
        ("executions (training and evaluation)", f"{t.executions}"),
        ("model calls", f"{t.calls:,}"),
        ("tokens in calls / unique tokens", f"{t.tokens_in_calls:,} / {t.unique_tokens:,}"),
        ("dedup ratio of calls (tokens in calls / unique tokens)", _ratio(t.dedup_ratio)),
        (
            "dedup ratio per execution (median / max)",
            f"{_ratio(t.dedup_ratio_median)} / {_ratio(t.dedup_ratio_max)}",
        ),
        ("branches (tree leaves)", f"{t.branches:,}"),
        (
            "branches per execution (median / max)",
            "n/a" if not trees else f"{t.branches_median:g} / {t.branches_max}",
        ),
        ("branch points", f"{t.branch_points:,}"),
        ("longest path (tokens)", f"{t.depth_max:,}"),
        ("rewritten-history calls by reason", _reasons(t.divergences)),
    ]
    lines = ["## Trajectory trees", "", "| | |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    shown = sorted(trees, key=lambda x: (-x.tokens_in_calls, x.execution_id))[:TREES_SHOWN]
    lines += [
        "",
        f"Largest {len(shown)} of {len(trees)} executions by tokens in calls (all in "
        f"[{TREES_CSV}]({TREES_CSV})):",
        "",
        "| execution | calls | tokens in calls | unique tokens | dedup ratio | branches | "
        "branch points | depth | rewritten history |",
        "|" + " --- |" * 9,
    ]
    lines += [
        f"| `{x.execution_id}` | {x.calls} | {x.tokens_in_calls:,} | {x.unique_tokens:,} | "
        f"{_ratio(x.dedup_ratio)} | {x.branches} | {x.branch_points} | {x.depth:,} | "
        f"{_reasons(x.divergences)} |"
        for x in shown
    ]
    return "\n".join(lines) + "\n"


def _write_trees_csv(trees: list[ExecutionTree], path: Path) -> None:
    fields = [
        "execution_id",
        "calls",
        "tokens_in_calls",
        "unique_tokens",
        "dedup_ratio",
        "policy_tokens",
        "branches",
        "branch_points",
        "depth",
        "divergences",
    ]
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(fields)
        for x in trees:
            out.writerow(
                [
                    x.execution_id,
                    x.calls,
                    x.tokens_in_calls,
                    x.unique_tokens,
                    repr(x.dedup_ratio),
                    x.policy_tokens,
                    x.branches,
                    x.branch_points,
                    x.depth,
                    _reasons(x.divergences),
                ]
            )


def write_report(run_dir: str | os.PathLike[str], *, log_name: str = CALL_LOG) -> Path:
    """Write `<run_dir>/report/` (`summary.md` and the `PLOTS`) from `<run_dir>/metrics.jsonl`.

    The page has a table per step (`steps_table`). When `<run_dir>/timeline.jsonl` exists, also
    `TIMELINE_PLOT` and a utilisation table per step (`utilisation_table`); when the call log
    `<run_dir>/<log_name>` exists, the trajectory-tree statistics (`trees_section`) and
    `TREES_CSV`. Returns the path of `summary.md`. Raises
    `FileNotFoundError` when the run has no metrics file. A run with no step yet still gets a
    page (with n/a) and empty plots.
    """
    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    steps, evals = split_records(records)
    out = run_dir / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    plot_pass_rate(steps, evals, out / PLOTS[0])
    plot_time_split(steps, out / PLOTS[1])
    plot_mismatch(steps, out / PLOTS[2])
    page = _markdown(run_dir, summarize(records))
    page += "\n".join(
        [
            "## Steps",
            "",
            steps_table(steps),
            "",
            SUSPENSIONS_NOTE,
            "",
        ]
    )
    if (run_dir / log_name).exists():
        trees = execution_trees(run_dir, log_name)
        _write_trees_csv(trees, out / TREES_CSV)
        page += "\n" + trees_section(trees)
    if (run_dir / TIMELINE_FILE).exists():
        page += "\n" + _timeline_section(run_dir, out)
    summary = out / "summary.md"
    summary.write_text(page)
    return summary
