"""The live run page: cells, water level, steps, executions and trajectory trees, while a run runs.

`RunView` (`runview`) reads a run folder as it grows (`CallIndex`, `calls`: the call log read
incrementally; `TreeView`, `tree_view`: one execution's tree, Jmax selection and loss weights);
`page_app` (`app`) serves it read-only behind the run's secret; `open_page` / `serve_run_dir`
(`server`) serve it from the node or on a finished run folder; `RuntimeFeed` (`feed`) is the
elastic runtime's live snapshot. Front-end files are under `static/` (uPlot vendored from npm).
Reads only run folders and the runtime's records; knows nothing about how they were produced.
"""

from __future__ import annotations

from gyre.report.live.app import PageAuth, page_app
from gyre.report.live.calls import CallIndex, ExecutionCalls
from gyre.report.live.feed import RuntimeFeed
from gyre.report.live.runview import STATES, RunView, state_of
from gyre.report.live.server import Page, open_page, serve_page, serve_run_dir
from gyre.report.live.tree_view import TreeView

__all__ = [
    "CallIndex",
    "ExecutionCalls",
    "Page",
    "PageAuth",
    "RunView",
    "RuntimeFeed",
    "STATES",
    "TreeView",
    "open_page",
    "page_app",
    "serve_page",
    "serve_run_dir",
    "state_of",
]
