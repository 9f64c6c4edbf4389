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

from gyre.agents.longtail import LongtailSettings, draw_plan, longtail_command, plan_seed
from gyre.config import config_from_dict
from gyre.engines.scripted import ScriptedEngine
from gyre.errors import EngineUnavailableError, RunStalled, grouped_errors
from gyre.model.recipe import build_tokenizer
from gyre.report.live import RuntimeFeed
from gyre.runtime.cell_handle import CellHandle
from gyre.runtime.elastic_job import run_cells
from gyre.runtime.metrics import StepMetrics, read_metrics
from gyre.runtime.scheduler import (
    AsyncPolicy,
    ElasticPolicy,
    StartStep,
    SwitchToRollout,
    SwitchToTrain,
)
from gyre.runtime.timeline import read_timeline
from gyre.tasks.task import load_suite
from gyre.tito.log import read_log
from tests.runtime.fake_cells import Exchange, FakeTrainingCell

REPO = Path(__file__).resolve().parents[2]
AGENT = Path(__file__).with_name("coin_agent.py")
B, G, STEPS, CELLS, CAP = 4, 2, 3, 3, 2
STORM_STEPS = 4


def config(run_dir: Path, policy: str, *, streaming: bool = True, steps: int = STEPS) -> object:
    return config_from_dict(
        {
            "run_dir": str(run_dir),
            "seed": 1,
            "loop": {"steps": steps, "batch_executions": B, "group_size": G},
            "scheduler": {"policy": policy, "capacity_per_cell": CAP, "streaming": streaming},
            "tasks": {
                "suites": [str(REPO / "examples/tasks/learnable")],
                "harness": {"agent_command": ["python", str(AGENT)]},
            },
            "router": {"no_cell_timeout_s": 60},
        }
    )


def make_cells(tok, n: int = CELLS) -> list[FakeTrainingCell]:
    exchange = Exchange()
    return [
        FakeTrainingCell(
            i,
            ScriptedEngine(eos_token_id=tok.eos_token_id, vocab_size=len(tok), max_model_len=4096),
            exchange,
        )
        for i in range(n)
    ]


async def drive(cfg, fakes, *, processes=None):
    tok = build_tokenizer()
    tasks = load_suite(REPO / "examples/tasks/learnable")
    cells = [
        CellHandle(name=f"cell-{i}", client=f, process=(processes or {}).get(i))
        for i, f in enumerate(fakes)
    ]
    return await run_cells(cfg, cells, tokenizer=tok, tasks=tasks, snapshot="model", launch="L")


def group_of(execution_id: str) -> int:
    """The group index in an execution ID `x<k>-<launch>-t<group>-g<slot>`."""
    return int(execution_id.rsplit("-t", 1)[1].split("-g")[0])


def check_accounting(runtime, fakes, run_dir: Path) -> list[Counter]:
    core = fakes[0]
    steps = core.steps
    assert len(steps) == STEPS == len(runtime.ledger.records)
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
    assert all(m.grad_norm == 1.0 for m in metrics)  # the core's `StepResult.grad_norm`
    # the coin agent solves its task in odd group slots: exactly half of every batch passes
    assert all(m.pass_rate == 0.5 for m in metrics)
    # the router's recovered failures, per step: they add up to its counters (issue 18)
    router = runtime.router.statistics()
    for field in (
        "requests_redirected",
        "requests_retried",
        "requests_abandoned",
        "aborts_failed",
        "migrations_missed",
    ):
        per_step = [getattr(m, field) for m in metrics]
        assert min(per_step) >= 0 and sum(per_step) <= getattr(router, field), (field, per_step)
    return steps


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])  # slow tier: the node's backend only
@pytest.mark.parametrize("policy", ["colocate", "async", "elastic"])
async def test_each_policy_trains_every_batch_once(policy: str, tmp_path: Path) -> None:
    tok = build_tokenizer()
    fakes = make_cells(tok)
    runtime = await drive(config(tmp_path / "run", policy), fakes)
    check_accounting(runtime, fakes, tmp_path / "run")
    timeline = read_timeline(tmp_path / "run")
    kinds = {iv.kind for iv in timeline.intervals}
    assert {"rollout", "train", "step"} <= kinds
    stats = runtime.statistics()
    assert stats.steps_done == stats.weight_version == STEPS and stats.cells_dead == 0
    if policy == "async":  # a fixed split: the core trains from the start, nothing ever switches
        assert stats.switches == 0 and fakes[0].switches == ["train"]
        assert stats.roles == ("train", "rollout", "rollout")
        assert all(f.switches == [] for f in fakes[1:])
    else:  # colocate and elastic move cells, and every switch shows in the timeline
        assert stats.switches == len(runtime.state.switch_s) > 0
        # a switch writes "switching" when it begins and its target role when it ends; whether
        # the core is moved back to rollout before the last step depends on timing (elastic)
        roles = [rc.role for rc in timeline.roles]
        assert roles.count("switching") == stats.switches
        assert len(roles) == 2 * stats.switches and "train" in roles
    if policy == "colocate":  # every cell trains every batch: satellites join the accumulation
        assert all(f.switches[:2] == ["train", "rollout"] for f in fakes)


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])  # slow tier: the node's backend only
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
@pytest.mark.parametrize("anyio_backend", ["trio"])  # slow tier: the node's backend only
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
    assert not runtime.state.cells[2].alive
    assert (
        fakes[2].engine.statistics().requests_total == calls_at_kill["n"]
    )  # nothing more went there


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])  # slow tier: the node's backend only
async def test_a_satellite_that_dies_sending_its_gradient_is_dropped(tmp_path: Path) -> None:
    """The gradient send runs in a task group (satellite sends, core receives), which raised the
    satellite's error inside an ExceptionGroup; the step's `except GyreError` missed it and the
    run crashed instead of dropping the cell (found by an audit). Colocate: every cell trains
    every batch; the first satellite to send dies, and its groups are trained again."""
    tok = build_tokenizer()
    fakes = make_cells(tok)
    processes = {i: _Process() for i in (1, 2)}
    sent = []

    def dies_on_the_first_send(i: int):
        send = fakes[i].send_gradients

        async def send_gradients(dst):
            if not sent:
                sent.append(i)
                processes[i].code = -9
                fakes[i].role = "dead"  # its engine refuses from now on, as a dead process would
                raise EngineUnavailableError(f"cell-{i} /send_gradients: connection refused")
            await send(dst)

        return send_gradients

    for i in (1, 2):
        fakes[i].send_gradients = dies_on_the_first_send(i)
    runtime = await drive(config(tmp_path / "run", "colocate"), fakes, processes=processes)
    (victim,) = sent
    # Each batch trained once all the same; the dead cell's gradient is gone with its process.
    check_accounting(runtime, [f for i, f in enumerate(fakes) if i != victim], tmp_path / "run")
    assert [c.alive for c in runtime.state.cells] == [i != victim for i in range(3)]
    stats = runtime.statistics()
    assert stats.steps_done == STEPS and stats.cells_dead == 1


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])  # slow tier: the node's backend only
async def test_a_fixed_split_that_loses_its_only_rollout_cell_stops_instead_of_waiting(
    tmp_path: Path,
) -> None:
    """`async` never changes a role. Its only rollout cell dies between executions (staleness 0:
    the 4 executions of step 1 all ended before the core steps), so nothing can roll out step 2.
    The run used to wait for ever; it stops with `RunStalled` naming the cells."""
    fakes = make_cells(build_tokenizer(), n=2)
    victim = _Process()
    runtimes = []
    step = fakes[0].step

    async def step_then_lose_the_rollout_cell(snapshot_root):
        result = await step(snapshot_root)
        (runtime,) = runtimes
        assert runtime.state.cells[1].executions == set()  # nothing for it to hand on
        victim.code = -9
        fakes[1].role = "dead"  # its engine refuses from now on, as a dead process would
        with anyio.fail_after(30):  # dropped by the runtime's watch before the weights load
            while runtime.state.cells[1].alive:
                await anyio.sleep(0.05)
        return result

    fakes[0].step = step_then_lose_the_rollout_cell
    cells = [
        CellHandle(name=f"cell-{i}", client=f, process=victim if i else None)
        for i, f in enumerate(fakes)
    ]
    with pytest.raises(BaseException) as caught:
        await run_cells(
            config(tmp_path / "run", "async"),
            cells,
            tokenizer=build_tokenizer(),
            tasks=load_suite(REPO / "examples/tasks/learnable"),
            snapshot="model",
            policy=AsyncPolicy(num_train_cells=1, max_staleness_steps=0),
            on_runtime=runtimes.append,
        )
    (error,) = grouped_errors(caught.value) or [caught.value]
    assert isinstance(error, RunStalled)
    assert str(error) == (
        "async: nothing runs after 1 of 3 steps and the policy starts nothing "
        "(cells: cell-0 train, cell-1 dead)"
    )
    assert len(fakes[0].steps) == 1 and sum(fakes[0].steps[0].values()) == B


class ChaosPolicy:
    """`ElasticPolicy` plus `budget` forced switches of satellite cells: whenever the inner policy
    neither switches nor dispatches and no cell is switching, one satellite flips its role. Each
    step's optimizer update waits until that step's share of the budget has been switched."""

    name = "chaos"

    def __init__(self, budget: int, steps: int) -> None:
        self.inner = ElasticPolicy()
        self.per_step = budget // steps
        self.budget = budget
        self.forced = 0
        self.turn = 0

    def initial_roles(self, num_cells: int, core_cell: int):
        return self.inner.initial_roles(num_cells, core_cell)

    def decide(self, state):
        actions = self.inner.decide(state)
        if self.forced < self.per_step * (state.steps_done + 1):  # each step takes its share
            actions = tuple(a for a in actions if not isinstance(a, StartStep))
        if self.forced == self.budget or state.any_switching or actions:
            return actions
        satellites = [c for c in state.cells if not c.is_core]
        self.turn += 1
        rollout = state.with_role("rollout")
        for k in range(len(satellites)):  # the next satellite that can flip, round robin
            cell = satellites[(self.turn + k) % len(satellites)]
            room = sum(state.capacity_per_cell - c.executions for c in rollout if c is not cell)
            if cell.role == "rollout" and len(rollout) > 1 and cell.executions <= room:
                self.forced += 1
                return (SwitchToTrain(cell.index),)
            if cell.role == "train" and not cell.busy:
                self.forced += 1
                return (SwitchToRollout(cell.index),)
        return actions


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])  # slow tier: the node's backend only
async def test_hundred_forced_switches_during_long_executions_lose_nothing(tmp_path: Path) -> None:
    """Long executions (the longtail agent: many calls, streamed tokens) while satellites are
    switched 100 times: every execution finishes with exactly its planned calls, one record each,
    and every batch trains once."""
    tok = build_tokenizer()
    exchange = Exchange()
    fakes = [
        FakeTrainingCell(
            i,
            ScriptedEngine(
                eos_token_id=tok.eos_token_id,
                vocab_size=len(tok),
                max_model_len=8192,
                token_delay_s=0.03,
            ),
            exchange,
        )
        for i in range(4)
    ]
    settings = LongtailSettings(
        turns_median=10,
        turns_sigma=0.3,
        max_turns=20,
        tool_median_s=0.05,
        tool_sigma=0.1,
        tool_max_s=0.2,
        max_tokens=12,
    )
    cfg = config_from_dict(
        {
            "run_dir": str(tmp_path / "run"),
            "seed": 1,
            "loop": {
                "steps": STORM_STEPS,
                "batch_executions": B,
                "group_size": G,
                "heldout_tasks": 0,
                "max_concurrent_executions": 16,
            },
            "scheduler": {"policy": "elastic", "capacity_per_cell": 4},
            "tasks": {
                "suites": [str(REPO / "examples/tasks/longtail")],
                "harness": {"agent_command": list(longtail_command(settings))},
            },
            "router": {"no_cell_timeout_s": 60},
        }
    )
    chaos = ChaosPolicy(budget=100, steps=STORM_STEPS)
    cells = [CellHandle(name=f"cell-{i}", client=f) for i, f in enumerate(fakes)]
    feed = RuntimeFeed()  # every outcome the rollout returned (the runtime keeps none it trained)
    runtime = await run_cells(
        cfg,
        cells,
        tokenizer=tok,
        tasks=load_suite(REPO / "examples/tasks/longtail"),
        snapshot="model",
        policy=chaos,
        launch="L",
        on_runtime=feed.attach,
    )
    assert chaos.forced == 100
    assert runtime.statistics().switches >= 100
    log = read_log(tmp_path / "run" / "calls.log")
    ended = feed.outcomes
    assert len(ended) >= STORM_STEPS * B
    for outcome in ended:
        eid = outcome.execution_id
        planned = draw_plan(plan_seed(eid), settings).turns
        assert outcome.termination == "finished" and outcome.score.score == 1.0, (eid, outcome)
        assert len(log.for_execution(eid)) == planned  # no call lost, none duplicated
        assert all(c.completion_ids for c in log.for_execution(eid))  # every response complete
    trained = Counter()
    for grads in fakes[0].steps:
        trained.update(grads)
    assert len(fakes[0].steps) == STORM_STEPS and max(trained.values()) == 1
