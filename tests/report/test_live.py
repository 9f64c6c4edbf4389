"""The live run page without a browser: the incremental call index equals `read_log`; a tree's
loss weights equal `pack_tree`'s; bad requests (no secret 401, unknown execution 404, bad
parameters 400, a used login link 401); with the page off, the job opens no port."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import httpx
import msgspec
import numpy as np
import pytest

from gyre.config import config_from_dict
from gyre.engines.protocol import SamplingParams
from gyre.report.live import CallIndex, PageAuth, RunView, page_app
from gyre.runtime.checkpoint import ExecutionLedger, LedgerEntry
from gyre.runtime.metrics import MetricsWriter
from gyre.tasks.outcome import Outcome, Score
from gyre.tito.log import CallLog, read_log
from gyre.tito.records import Divergence, FullCall, ModelCall, to_reference
from gyre.trajectory import build_tree, pack_tree, select_trajectories
from tests.report.test_report import step

SECRET = "s3cret-" + "x" * 20


def call(
    eid: str,
    cid: str,
    prompt: list[int],
    completion: list[int],
    *,
    parent: str | None = None,
    divergence: Divergence | None = None,
    role: str = "main",
) -> FullCall:
    n = len(completion)
    return FullCall(
        execution_id=eid,
        call_id=cid,
        role=role,
        prompt_ids=prompt,
        completion_ids=completion,
        logprobs=[-0.5 - 0.1 * i for i in range(n)],
        versions=[1] * n,
        finish_reason="stop",
        parent_call_id=parent,
        sampling=SamplingParams(temperature=1.0),
        divergence=divergence,
    )


async def write_log(path: Path) -> list[ModelCall]:
    """e1: call c1, c2 extending it (stored as a delta), c3 a compaction branching at token 1;
    e2: one call; e4: one greedy call (not trained); e5: one call; e1 is closed."""
    from gyre.tito.records import ExecutionSummary

    c1, c2, c3 = to_reference(
        [
            call("e1", "c1", [1, 2, 3], [4, 5]),
            call("e1", "c2", [1, 2, 3, 4, 5, 6], [7, 8, 9], parent="c1"),  # stored as a delta
            call(
                "e1",
                "c3",
                [1, 10, 11],
                [12, 13],
                divergence=Divergence(parent_call_id="c2", index=1, reason="compaction"),
                role="main_summary",
            ),
        ]
    )
    [d1] = to_reference([call("e2", "c1", [1, 2], [3])])
    log = CallLog(path)
    await log.append_call(c1)
    await log.append_call(c2)
    await log.append_call(c3)
    await log.append_call(d1)
    [greedy] = to_reference([call("e4", "c1", [1, 2], [3, 4])])
    await log.append_call(msgspec.structs.replace(greedy, sampling=SamplingParams(temperature=0.0)))
    await log.append_call(to_reference([call("e5", "c1", [1, 2], [5, 6])])[0])
    await log.append_end(
        ExecutionSummary(
            execution_id="e1",
            num_calls=3,
            truncated=False,
            length_calls=0,
            context_refusals=0,
            divergences=1,
            prompt_tokens=12,
            completion_tokens=7,
        )
    )
    log.close()
    return [c1, c2, c3, d1]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    anyio.run(write_log, tmp_path / "calls.log")
    MetricsWriter(tmp_path).write(step(1, pass_rate=0.5))
    ledger = ExecutionLedger(tmp_path)
    for eid in ("e4", "e5"):
        done = Score(passed=1, total=1, score=1.0, all_passed=True)
        outcome = Outcome(execution_id=eid, task_id="t-c", termination="finished", score=done)
        ledger.append(LedgerEntry(step=1, task_id="t-c", slot=0, outcome=outcome))
    ledger.append(
        LedgerEntry(
            step=1,
            task_id="t-a",
            slot=0,
            outcome=Outcome(
                execution_id="e1",
                task_id="t-a",
                termination="timeout",
                score=Score(
                    passed=1,
                    total=3,
                    score=1 / 3,
                    all_passed=False,
                    failed_tests=("test_b", "test_c"),
                ),
            ),
        )
    )
    ledger.append(
        LedgerEntry(
            step=1,
            task_id="t-b",
            slot=0,
            outcome=Outcome(
                execution_id="e3",
                task_id="t-b",
                termination="failed",
                failure_reason="agent crashed",
            ),
        )
    )
    return tmp_path


def test_call_index_equals_read_log_and_grows(run_dir: Path) -> None:
    index = CallIndex(run_dir / "calls.log")
    assert index.refresh() is True
    full = read_log(run_dir / "calls.log")
    for eid in ("e1", "e2"):
        assert index.calls_of(eid) == full.for_execution(eid)
    e1 = index.executions["e1"]
    assert (e1.calls, e1.completion_tokens, e1.prompt_tokens) == (3, 7, 3 + 6 + 3)
    assert e1.roles == {"main": 2, "main_summary": 1} and e1.divergences == {"compaction": 1}
    assert e1.summary is not None and index.executions["e2"].summary is None
    assert index.refresh() is False
    size = (run_dir / "calls.log").stat().st_size
    with open(run_dir / "calls.log", "ab") as f:  # half a frame: left for the next refresh
        f.write(b"\x10\x00\x00\x00\x01")
    assert index.refresh() is False and index.offset == size

    async def more() -> None:
        os.truncate(run_dir / "calls.log", size)
        log = CallLog(run_dir / "calls.log")
        e2 = [call("e2", "c1", [1, 2], [3]), call("e2", "c2", [1, 2, 3, 5], [6], parent="c1")]
        await log.append_call(to_reference(e2)[1])  # shares c1's 3 tokens
        log.close()

    anyio.run(more)
    assert index.refresh() is True
    assert index.calls_of("e2") == read_log(run_dir / "calls.log").for_execution("e2")


def test_tree_loss_weights_are_the_packed_batch_values(run_dir: Path) -> None:
    view = RunView(run_dir, jmax=1)
    tv = view.tree("e1")
    calls = read_log(run_dir / "calls.log").for_execution("e1")
    tree = build_tree(calls)
    sel = select_trajectories(tree, 1)
    denominator = 2  # step 1 trains e1 and e5 (e3 failed, e4 greedy; e2 is in no step yet)
    packed = pack_tree(tree, sel, num_executions=denominator)
    assert tv.num_executions == denominator
    np.testing.assert_array_equal(tv.weight_N[packed.node_T], packed.loss_weight_T)
    outline = tv.outline()
    comp = [s for s in outline["segments"] if s["divergence"]]
    assert [(s["call_id"], s["divergence"]["reason"], s["parent_node"]) for s in comp] == [
        ("c3", "compaction", 0)
    ]
    assert len(outline["selected_leaves"]) == 1  # jmax = 1: main outranks main_summary
    assert outline["selected_leaves"][0]["role"] == "main"
    toks = tv.tokens(comp[0]["id"], 0, 10, None)["tokens"]
    assert [t["id"] for t in toks] == [10, 11, 12, 13]
    assert [t["loss_weight"] for t in toks] == [0.0] * 4  # not on the selected path


def client(run_dir: Path, **kw) -> tuple[httpx.AsyncClient, PageAuth]:
    auth = PageAuth(SECRET)
    app = page_app(RunView(run_dir, **kw), auth)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://page"), auth


@pytest.mark.anyio
async def test_bad_requests(run_dir: Path) -> None:
    c, auth = client(run_dir)
    bearer = {"Authorization": f"Bearer {SECRET}"}
    async with c:
        for path in ("/", "/api/steps", "/api/executions", "/api/executions/e1", "/static/page.js"):
            assert (await c.get(path)).status_code == 401, path
            assert (await c.get(path, headers={"Authorization": "Bearer wrong"})).status_code == 401
        assert (await c.get("/api/executions/nope", headers=bearer)).status_code == 404
        assert (await c.get("/api/executions/e1/segments/99", headers=bearer)).status_code == 404
        assert (await c.get("/api/executions/nope/segments/0", headers=bearer)).status_code == 404
        assert (await c.get("/api/executions?state=bogus", headers=bearer)).status_code == 400
        assert (await c.get("/api/executions?page=-1", headers=bearer)).status_code == 400
        assert (await c.get("/api/executions?page_size=abc", headers=bearer)).status_code == 400
        assert (await c.get("/login?token=made-up")).status_code == 401
        token = auth.one_time_token()
        r = await c.get(f"/login?token={token}")
        assert r.status_code == 303 and r.cookies.get("gyre_page") == SECRET
        assert (await c.get("/api/steps")).status_code == 200  # the cookie is kept by the client
        c.cookies.clear()
        assert (await c.get(f"/login?token={token}")).status_code == 401  # one time only
        assert (await c.get("/api/steps")).status_code == 401


@pytest.mark.anyio
async def test_executions_states_filters_and_verifier(run_dir: Path) -> None:
    c, _ = client(run_dir)
    bearer = {"Authorization": f"Bearer {SECRET}"}
    async with c:
        d = (await c.get("/api/executions", headers=bearer)).json()
        states = {r["execution_id"]: r["state"] for r in d["rows"]}
        assert states == {
            "e1": "partial",
            "e2": "running",
            "e3": "failed",
            "e4": "finished",
            "e5": "finished",
        }
        assert d["counts"]["partial"] == d["counts"]["running"] == d["counts"]["failed"] == 1
        assert d["counts"]["finished"] == 2
        d = (await c.get("/api/executions?state=failed", headers=bearer)).json()
        assert [(r["execution_id"], r["reason"]) for r in d["rows"]] == [("e3", "agent crashed")]
        d = (await c.get("/api/executions?q=t-a", headers=bearer)).json()
        assert [r["execution_id"] for r in d["rows"]] == ["e1"]
        d = (await c.get("/api/executions?page=1&page_size=2", headers=bearer)).json()
        # newest first: the log's order (e1, e2, e4, e5), then e3 (in the ledger only), reversed
        assert d["total"] == 5 and [r["execution_id"] for r in d["rows"]] == ["e4", "e2"]
        e1 = (await c.get("/api/executions/e1", headers=bearer)).json()
        assert e1["verifier"] == {
            "passed": 1,
            "total": 3,
            "score": 1 / 3,
            "all_passed": False,
            "failed_tests": ["test_b", "test_c"],
            "partial": True,
        }
        assert e1["row"]["roles"] == {"main": 2, "main_summary": 1}
        e3 = (await c.get("/api/executions/e3", headers=bearer)).json()
        assert e3["tree"] is None and e3["row"]["state"] == "failed"
        steps = (await c.get("/api/steps", headers=bearer)).json()
        assert [s["step"] for s in steps["steps"]] == [1]


def _listening_ports() -> set[int]:
    """TCP ports this process listens on (from /proc: sockets among its open descriptors)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            parts = line.split()
            if parts[3] == "0A" and parts[9] in inodes:  # LISTEN
                ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


@pytest.mark.anyio
async def test_page_off_opens_no_port_and_on_opens_one(tmp_path: Path) -> None:
    from gyre.job import _observed

    seen: list[set[int]] = []

    async def job(config, model_dir, **kw) -> str:
        seen.append(_listening_ports())
        return "done"

    before = _listening_ports()
    off = config_from_dict({"run_dir": str(tmp_path)})
    assert await _observed(off, tmp_path, job) == "done"
    assert seen[-1] == before
    on = config_from_dict({"run_dir": str(tmp_path), "observe": {"page": True}})
    assert await _observed(on, tmp_path, job) == "done"
    assert len(seen[-1] - before) == 1
    assert _listening_ports() == before


def test_cells_read_the_timeline_as_it_grows(tmp_path: Path) -> None:
    from gyre.runtime.timeline import TimelineWriter, read_timeline
    from tests.runtime.test_timeline import write_two_steps

    write_two_steps(tmp_path)
    view = RunView(tmp_path)
    d = view.cells({}, None)
    tl = read_timeline(tmp_path)
    assert d["intervals"] == [
        [iv.cell, iv.start_s, iv.end_s, iv.kind, iv.step] for iv in tl.intervals
    ]
    assert d["water"] == [list(x) for x in zip(tl.water_t_s, tl.water_level, tl.rollout_capacity)]
    assert d["roles"] == [[r.t_s, r.cell, r.role] for r in tl.roles]
    assert d["num_cells"] == 2 and d["live"] is None
    with TimelineWriter(tmp_path) as w:
        w.role(15.0, 1, "train")
        w.interval(1, 14.0, 15.0, "switch", 3)
    again = view.cells(d["cursor"], {"cells": [{}, {}, {}], "outcomes": [], "where": {}})
    assert again["intervals"] == [[1, 14.0, 15.0, "switch", 3]]
    assert again["roles"] == [[15.0, 1, "train"]] and again["water"] == []
    assert again["num_cells"] == 3 and "outcomes" not in again["live"]


def test_observe_config_is_validated() -> None:
    from gyre.errors import ConfigError

    assert config_from_dict({}).observe.page is False  # off by default: no port
    on = config_from_dict({"observe": {"page": True, "port": 8765}}).observe
    assert (on.host, on.port, on.poll_interval_s) == ("127.0.0.1", 8765, 1.0)
    for bad in (
        {"port": 70000},
        {"port": -1},
        {"host": ""},
        {"poll_interval_s": 0},
        {"pages": True},
    ):
        with pytest.raises(ConfigError):
            config_from_dict({"observe": bad})
