"""The live run page in a real browser (Debian's headless Chromium driven by Playwright): a short
elastic run on cell doubles (scripted engines, real agents through the proxy) is watched while it
runs. Checked: the cells view shows every cell and a role change before the run ends; the steps
table gains rows without a reload; the execution list filters by state; a compacted execution's
tree shows the branch and its reason; hovering a policy token shows its loss weight, equal to the
packed batch's value. Screenshots of each view go to the test's tmp folder (path printed).
Skips, with the reason, without /usr/bin/chromium or the playwright package.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from pathlib import Path

import anyio
import numpy as np
import pytest

from gyre.config import config_from_dict
from gyre.model.recipe import build_tokenizer
from gyre.report.live import RuntimeFeed, open_page
from gyre.report.live.server import view_for
from gyre.runtime.cell_handle import CellHandle
from gyre.runtime.elastic_job import run_cells
from gyre.tasks.task import load_suite
from gyre.tito.log import read_log
from gyre.trajectory import build_tree, pack_tree, select_trajectories
from tests.runtime.test_elastic import make_cells

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[2]
AGENT = Path(__file__).with_name("compacting_agent.py")
B, G, STEPS, CELLS, CAP = 4, 2, 4, 3, 2
SECRET = "browser-test-" + "k" * 24

playwright = pytest.importorskip(
    "playwright.sync_api", reason="the playwright package is not installed"
)
pytestmark = [
    pytest.mark.skipif(
        not (os.path.exists(CHROMIUM) or shutil.which("chromium")),
        reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)",
    ),
    pytest.mark.slow,
]


def watch(url: str, shots: Path, ready: threading.Event, done: threading.Event, out: dict) -> None:
    """The browser's side, in a thread of its own (Playwright's sync API)."""
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-dev-shm-usage",
            ],
        )
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(url)  # the one-time login link: sets the cookie, lands on the cells view
            page.wait_for_selector("#cells-table")
            page.evaluate("window.__noReload = 1")
            ready.set()
            page.wait_for_function(
                f"document.querySelectorAll('#cells-table tbody tr').length === {CELLS} && "
                "document.querySelectorAll('#role-changes li').length >= 1",
                timeout=120_000,
            )
            out["role_change_while_running"] = not done.is_set()
            out["cells"] = page.locator("#cells-table tbody tr td:first-child").all_inner_texts()
            out["role_changes"] = page.locator("#role-changes li").all_inner_texts()
            page.screenshot(path=str(shots / "cells.png"), full_page=True)

            page.click("nav a[data-view=steps]")
            seen = []
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                n = page.locator("#steps-table tbody tr").count()
                if not seen or seen[-1] != n:
                    seen.append(n)
                if done.is_set() and n == STEPS:
                    break
                time.sleep(0.1)
            out["step_rows_seen"] = seen
            page.screenshot(path=str(shots / "steps.png"), full_page=True)

            page.click("nav a[data-view=executions]")
            page.wait_for_selector("#executions-table tbody tr")
            page.select_option("#state-filter", "finished")
            page.wait_for_function(
                "[...document.querySelectorAll('#executions-table tbody tr')]"
                ".every(r => r.dataset.state === 'finished')",
                timeout=20_000,
            )
            rows = "[...document.querySelectorAll('#executions-table tbody tr')]"
            states = rows + ".map(r => r.dataset.state)"
            out["finished_rows"] = page.evaluate(states)
            page.screenshot(path=str(shots / "executions.png"), full_page=True)
            page.select_option("#state-filter", "failed")
            page.wait_for_function(
                "[...document.querySelectorAll('#executions-table tbody tr')]"
                ".every(r => r.dataset.state === 'failed')",
                timeout=20_000,
            )
            out["failed_rows"] = page.evaluate(states)
            page.select_option("#state-filter", "")
            page.wait_for_function(
                "document.querySelectorAll('#executions-table tbody tr').length > "
                f"{len(out['failed_rows'])}"
            )
            out["all_rows"] = page.evaluate(states)
            page.select_option("#state-filter", "finished")
            page.wait_for_function(
                "document.querySelectorAll('#executions-table tbody tr').length > 0"
            )

            row = page.locator("#executions-table tbody tr", has_text="compaction").first
            out["execution_id"] = row.get_attribute("data-id")
            row.click()
            badge = page.locator(".badge.divergence[data-reason=compaction]").first
            badge.wait_for(timeout=20_000)
            out["branch"] = badge.inner_text()
            out["reason"] = badge.get_attribute("data-reason")
            page.locator(".segment.selected .head").first.click()
            token = page.locator(".tok.policy.selected").first
            token.wait_for(timeout=20_000)
            token.hover()
            page.wait_for_selector("#tooltip:not([hidden])")
            out["tooltip"] = page.inner_text("#tooltip")
            out["node"] = int(token.get_attribute("data-node"))
            page.screenshot(path=str(shots / "tree.png"), full_page=True)
            out["no_reload"] = page.evaluate("window.__noReload === 1")
        finally:
            browser.close()


def test_live_page_in_a_browser(tmp_path: Path) -> None:
    run_dir, shots = tmp_path / "run", tmp_path / "screenshots"
    shots.mkdir()
    print(f"\nscreenshots: {shots}")
    cfg = config_from_dict(
        {
            "run_dir": str(run_dir),
            "seed": 1,
            "loop": {"steps": STEPS, "batch_executions": B, "group_size": G},
            "cells": {"num_cells": CELLS},
            "scheduler": {"policy": "elastic", "capacity_per_cell": CAP},
            "tasks": {
                "suites": [str(REPO / "examples/tasks/learnable")],
                "harness": {"agent_command": ["python", str(AGENT)]},
            },
            "router": {"no_cell_timeout_s": 60},
            "observe": {"page": True, "poll_interval_s": 0.3},
        }
    )
    tok = build_tokenizer()
    ready, done, out = threading.Event(), threading.Event(), {}

    async def main() -> None:
        feed = RuntimeFeed()
        view = view_for(cfg, decode=lambda ids: [tok.decode([i]) for i in ids])
        async with open_page(
            view, secret=SECRET, snapshot=feed.snapshot, poll_interval_s=0.3, announce=None
        ) as page:
            async with anyio.create_task_group() as tg:
                url = page.login_url()
                tg.start_soon(anyio.to_thread.run_sync, watch, url, shots, ready, done, out)
                await anyio.to_thread.run_sync(ready.wait, 120)
                cells = [
                    CellHandle(name=f"cell-{i}", client=f) for i, f in enumerate(make_cells(tok))
                ]
                await run_cells(
                    cfg,
                    cells,
                    tokenizer=tok,
                    tasks=load_suite(REPO / "examples/tasks/learnable"),
                    snapshot="model",
                    launch="L",
                    on_runtime=feed.attach,
                )
                done.set()

    anyio.run(main, backend="trio")
    assert out["role_change_while_running"] is True
    assert out["cells"] == [f"cell-{i}" for i in range(CELLS)]
    assert re.fullmatch(r"[\d.]+ s: cell-\d -> (train|rollout|switching)", out["role_changes"][0])
    seen = out["step_rows_seen"]
    assert seen[-1] == STEPS and len(seen) >= 2 and seen == sorted(seen)  # rows appeared one by one
    assert out["no_reload"] is True
    finished, failed = out["finished_rows"], out["failed_rows"]
    assert finished and set(finished) == {"finished"} and set(failed) <= {"failed"}
    assert len(out["all_rows"]) >= len(finished) + len(failed)
    assert out["reason"] == "compaction" and "branch: compaction" in out["branch"]
    # the hovered token's loss weight is the packed batch's: 1 / selected policy tokens / B
    calls = read_log(run_dir / "calls.log").for_execution(out["execution_id"])
    tree = build_tree(calls)
    packed = pack_tree(tree, select_trajectories(tree, cfg.trajectory.jmax), num_executions=B)
    expected = float(packed.loss_weight_T[np.flatnonzero(packed.node_T == out["node"])[0]])
    assert expected > 0
    shown = float(re.search(r"loss weight (\S+)", out["tooltip"]).group(1))
    assert shown == expected
    assert all(
        (shots / f"{v}.png").stat().st_size > 0 for v in ("cells", "steps", "executions", "tree")
    )
