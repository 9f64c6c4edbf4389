"""Run report: PNG plots and a one-page markdown summary of `<run_dir>/metrics.jsonl`.

`write_report` (`page`) writes `<run_dir>/report/summary.md` with the numbers of `RunSummary`
(`summary.summarize`) and three plots (`plots`): pass rate and mean reward per step with the
held-out evaluations overlaid, the rollout/train/sync time split, and the off-policy logprob
mismatch. When the run recorded a timeline, it also draws the cells' Gantt chart (`gantt`) and
adds cell utilisation per step. A step recorded twice (a run killed after writing a step and
resumed before its checkpoint) counts once, with its last record. Reads only `gyre.runtime`
records; knows nothing about how they were produced. The names load on first use (`gyre._lazy`).
"""

from __future__ import annotations

import typing

from gyre._lazy import lazy_exports as _lazy_exports

if typing.TYPE_CHECKING:
    from gyre.report.page import PLOTS, REPORT_DIR, TIMELINE_PLOT, utilisation_table, write_report
    from gyre.report.summary import RunSummary, summarize

__all__ = [
    "RunSummary",
    "summarize",
    "write_report",
    "utilisation_table",
    "REPORT_DIR",
    "PLOTS",
    "TIMELINE_PLOT",
]

__getattr__, __dir__ = _lazy_exports(
    __name__,
    {
        **dict.fromkeys(["RunSummary", "summarize"], "gyre.report.summary"),
        **dict.fromkeys(
            ["write_report", "utilisation_table", "REPORT_DIR", "PLOTS", "TIMELINE_PLOT"],
            "gyre.report.page",
        ),
    },
)
