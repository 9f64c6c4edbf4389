"""The elastic driver over cell doubles: the three policies run real agents through the proxy,
the router and the harness; every step trains exactly one batch, no execution is lost or trained
twice, the satellites' gradients reach the core, and a cell that dies mid-rollout is dropped
while its executions finish elsewhere.

The cells are `fake_cells.FakeTrainingCell` (scripted engine + a ledger trainer whose gradient is
the multiset of trained execution IDs); the real cells' gradients are checked in
tests/engines (core + satellites == one trainer).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import anyio
import pytest

from gyre.config import config_from_dict
from gyre.engines.scripted import ScriptedEngine
from gyre.model.recipe import build_tokenizer
from gyre.runtime.elastic import Cell, run_cells
from gyre.runtime.metrics import StepMetrics, read_metrics
from gyre.runtime.timeline import read_timeline
from gyre.tasks.task import load_suite
from gyre.tito.log import read_log
from tests.runtime.fake_cells import Exchange, FakeTrainingCell

REPO = Path(__file__).resolve().parents[2]
AGENT = Path(__file__).with_name("coin_agent.py")
B, G, STEPS, CELLS, CAP = 4, 2, 3, 3, 2


def config(run_dir: Path, policy: str, *, streaming: bool = True, steps: int = STEPS) -> object:
    return config_from_dict({
        "run_dir": str(run_dir),
        "seed": 1,
        "loop": {"steps": steps, "batch_executions": B, "group_size": G},
        "scheduler": {"policy": policy, "capacity_per_cell": CAP, "streaming": streaming},
        "tasks": {"suites": [str(REPO / "examples/tasks/learnable")],
                  "harness": {"agent_command": ["python", str(AGENT)]}},
        "router": {"no_cell_timeout_s": 60},
    })


def make_cells(tok, n: int = CELLS) -> list[FakeTrainingCell]:
    exchange = Exchange()
    return [
        FakeTrainingCell(i, ScriptedEngine(eos_token_id=tok.eos_token_id, vocab_size=len(tok), max_model_len=4096), exchange)
        for i in range(n)
    ]


async def drive(cfg, fakes, *, processes=None):
    tok = build_tokenizer()
    tasks = load_suite(REPO / "examples/tasks/learnable")
    cells = [Cell(name=f"cell-{i}", client=f, process=(processes or {}).get(i)) for i, f in enumerate(fakes)]
    return await run_cells(cfg, cells, tokenizer=tok, tasks=tasks, snapshot="model", launch="L")


def group_of(execution_id: str) -> int:
    """The group index in an execution ID `x<k>-<launch>-t<group>-g<slot>`."""
    return int(execution_id.rsplit("-t", 1)[1].split("-g")[0])


def check_accounting(runtime, fakes, run_dir: Path) -> list[Counter]:
    core = fakes[0]
    steps = core.steps
    assert len(steps) == STEPS == len(runtime.records)
    trained = Counter()
    for grads in steps:
        # one batch per step: B executions of B // G groups, each trained exactly once
        assert sum(grads.values()) == len(grads) == B, grads
        groups = {group_of(eid) for eid in grads}
        assert len(groups) == B // G
        trained.update(grads)
    assert max(trained.values()) == 1  # no execution trained twice across steps
    assert all(not f.grads for f in fakes[1:])  # every satellite gradient reached the core
    log = read_log(run_dir / "calls.log")
    closed = set(log.summaries)
    assert set(trained) <= closed  # trained executions all ended and were closed in the proxy
    metrics = [r for r in read_metrics(run_dir) if isinstance(r, StepMetrics)]
    assert [m.step for m in metrics] == [1, 2, 3]
    assert [m.version for m in metrics] == [1, 2, 3]
    assert all(m.executions == B and m.failed == 0 for m in metrics)
    # the coin agent solves its task in odd group slots: exactly half of every batch passes
    assert all(m.pass_rate == 0.5 for m in metrics)
    return steps


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("policy", ["colocate", "async", "elastic"])
async def test_each_policy_trains_every_batch_once(policy: str, tmp_path: Path) -> None:
    tok = build_tokenizer()
    fakes = make_cells(tok)
    runtime = await drive(config(tmp_path / "run", policy), fakes)
    check_accounting(runtime, fakes, tmp_path / "run")
    timeline = read_timeline(tmp_path / "run")
    kinds = {iv.kind for iv in timeline.intervals}
    assert {"rollout", "train", "step"} <= kinds
    if policy == "async":  # a fixed split: the core trains from the start, nothing ever switches
        assert runtime.switch_s == [] and fakes[0].switches == ["train"]
        assert all(f.switches == [] for f in fakes[1:])
    else:  # colocate and elastic move cells, and every switch shows in the timeline
        assert runtime.switches_done == len(runtime.switch_s) > 0
        assert {rc.role for rc in timeline.roles} >= {"switching", "train", "rollout"}
    if policy == "colocate":  # every cell trains every batch: satellites join the accumulation
        assert all(f.switches[:2] == ["train", "rollout"] for f in fakes)


@pytest.mark.slow
@pytest.mark.anyio
async def test_not_streaming_trains_the_dispatched_groups(tmp_path: Path) -> None:
    tok = build_tokenizer()
    fakes = make_cells(tok)
    runtime = await drive(config(tmp_path / "run", "async", streaming=False), fakes)
    steps = check_accounting(runtime, fakes, tmp_path / "run")
    for s, grads in enumerate(steps):  # step s+1 trains groups s*2 and s*2+1, in dispatch order
        assert {group_of(eid) for eid in grads} == {2 * s, 2 * s + 1}


class _Process:
    """Stands for a cell process: `poll()` answers an exit code once killed."""

    def __init__(self) -> None:
        self.code = None

    def poll(self):
        return self.code


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_cell_killed_mid_rollout_is_dropped_and_nothing_is_lost(tmp_path: Path) -> None:
    tok = build_tokenizer()
    fakes = make_cells(tok)
    victim = _Process()
    cfg = config(tmp_path / "run", "async")
    calls_at_kill = {}

    async def kill_when_busy() -> None:
        engine = fakes[2].engine
        while engine.statistics().requests_total < 3:  # it served some of its executions' calls
            await anyio.sleep(0.01)
        calls_at_kill["n"] = engine.statistics().requests_total
        victim.code = -9
        fakes[2].role = "dead"  # its engine refuses from now on, as a dead process would

    async with anyio.create_task_group() as tg:
        tg.start_soon(kill_when_busy)
        runtime = await drive(cfg, fakes, processes={2: victim})
        tg.cancel_scope.cancel()
    check_accounting(runtime, fakes, tmp_path / "run")
    assert not runtime.cells[2].alive
    assert fakes[2].engine.statistics().requests_total == calls_at_kill["n"]  # nothing more went there
