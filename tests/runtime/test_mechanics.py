"""The mechanics the runtime and the simulator share (`gyre.runtime.mechanics`, batch formation),
and the proof that both drivers run them alike: one policy and one workload of given durations
through the simulator and through `ElasticRuntime` on cell doubles form the same batches."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from types import SimpleNamespace

import anyio
import msgspec
import pytest

from gyre.config import config_from_dict
from gyre.engines.scripted import ScriptedEngine
from gyre.errors import RunStalled, SimulationStalled
from gyre.rollout.source import Executed
from gyre.routing.router import Router
from gyre.runtime.batch_formation import BatchFormation, Group
from gyre.runtime.cell_handle import CellHandle
from gyre.runtime.elastic import ElasticRuntime
from gyre.runtime.mechanics import Running, assign_training, decide_until_idle, least_loaded
from gyre.runtime.scheduler import (
    AsyncPolicy,
    CellView,
    Dispatch,
    ElasticPolicy,
    SchedulerState,
    StartStep,
    SwitchToRollout,
    SwitchToTrain,
)
from gyre.sim.config import SimConfig
from gyre.sim.engine import Workload, _Sim
from gyre.tasks.task import Task, TaskSpec, load_suite
from tests.runtime.fake_cells import Exchange, FakeTrainingCell, failed_execution

REPO = Path(__file__).resolve().parents[2]


def cell(index: int, role: str, executions: int = 0, busy: bool = False) -> SimpleNamespace:
    return SimpleNamespace(index=index, role=role, executions=set(range(executions)), busy=busy)


# -- placement -------------------------------------------------------------------------------


def test_least_loaded_takes_the_emptiest_rollout_cell_lowest_index_first() -> None:
    cells = [cell(0, "train"), cell(1, "rollout", 2), cell(2, "rollout", 1), cell(3, "rollout", 1)]
    assert least_loaded(cells, capacity=2).index == 2  # 1 execution; cell 3 ties, higher index
    assert least_loaded(cells, capacity=2, avoid={2}).index == 3
    assert least_loaded(cells, capacity=2, avoid={2, 3}) is None  # cell 1 is full
    assert least_loaded(cells, capacity=None, avoid={2, 3}).index == 1  # beyond capacity
    assert least_loaded([cell(0, "train"), cell(1, "switching")], capacity=None) is None


# -- training assignment ---------------------------------------------------------------------


def test_ready_groups_go_to_idle_trainers_in_queue_and_cell_order() -> None:
    cells = [cell(0, "train", busy=True), cell(1, "rollout"), cell(2, "train"), cell(3, "train")]
    queue = deque(["g5", "g2", "g7"])
    started = []

    def start(c, group) -> None:
        c.busy = True
        started.append((c.index, group))

    assign_training(cells, queue, step_running=True, start=start)
    assert started == [] and list(queue) == ["g5", "g2", "g7"]  # the step's batch is closed
    assign_training(cells, queue, step_running=False, start=start)
    assert started == [(2, "g5"), (3, "g2")] and list(queue) == ["g7"]


# -- the decide loop ---------------------------------------------------------------------------


def state(*views: CellView) -> SchedulerState:
    return SchedulerState(
        cells=views, capacity_per_cell=2, batch_executions=4, dispatched=0, finished=0
    )


class Scripted:
    """A policy that plays `rounds` of actions, then nothing."""

    name = "scripted"

    def __init__(self, *rounds) -> None:
        self.rounds = list(rounds)

    def initial_roles(self, num_cells, core_cell):  # noqa: ANN001, ANN201 - test double
        return ("rollout",) * num_cells

    def decide(self, state):  # noqa: ANN001, ANN201 - test double
        return self.rounds.pop(0) if self.rounds else ()


def drive(policy, snapshot: SchedulerState, **over):
    applied = []
    callbacks = dict(
        prepare=lambda: applied.append("prepare"),
        state=lambda: snapshot,
        dispatch=lambda n: applied.append(("dispatch", n)),
        switch_to_train=lambda i, leaving: applied.append(("train", i, sorted(leaving))),
        switch_to_rollout=lambda i: applied.append(("rollout", i)),
        start_step=lambda: applied.append("step"),
    )
    callbacks.update(over)
    return decide_until_idle(policy, **callbacks), applied


def test_decide_applies_actions_in_order_until_the_policy_is_done() -> None:
    snap = state(
        CellView(index=0, role="rollout", is_core=True),
        CellView(index=1, role="rollout"),
        CellView(index=2, role="train"),
    )
    policy = Scripted((Dispatch(3), SwitchToTrain(0), SwitchToTrain(1)), (SwitchToRollout(2),))
    decisions, applied = drive(policy, snap)
    assert decisions == 2
    assert applied == [
        "prepare",
        ("dispatch", 3),
        ("train", 0, [0, 1]),  # both leaving cells, so nothing lands on cell 1
        ("train", 1, [0, 1]),
        "prepare",
        ("rollout", 2),
        "prepare",
    ]
    # `hold` keeps actions back before they are applied
    _, applied = drive(Scripted((Dispatch(1), StartStep())), snap, hold=lambda acts: acts[:1])
    assert applied == ["prepare", ("dispatch", 1), "prepare"]


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (Dispatch(3), r"Dispatch\(n=3\) exceeds free slots 2"),  # 1 rollout cell
        (SwitchToTrain(1), r"SwitchToTrain\(1\) but the cell is train"),
        (SwitchToRollout(0), r"SwitchToRollout\(0\) but the cell is rollout"),
        (SwitchToRollout(2), "busy=True"),
        (SwitchToTrain(7), "names no cell of 3"),
        (StartStep(), "StartStep before the batch is trained"),
    ],
)
def test_decide_refuses_what_the_snapshot_does_not_allow(action, message) -> None:
    snap = state(
        CellView(index=0, role="rollout", is_core=True),
        CellView(index=1, role="train"),
        CellView(index=2, role="train", busy=True),
    )
    with pytest.raises(ValueError, match=message):
        drive(Scripted((action,)), snap)


def test_a_policy_that_never_settles_is_stalled() -> None:
    class Forever(Scripted):
        def decide(self, state):  # noqa: ANN001, ANN201 - test double
            return (Dispatch(1),)

    snap = state(CellView(index=0, role="rollout", is_core=True))
    with pytest.raises(SimulationStalled, match="still acting after 7 decisions"):
        drive(Forever(), snap, stalled=SimulationStalled, max_decisions=7)


@pytest.mark.anyio
async def test_running_counts_a_task_from_its_start_to_its_end_and_says_when_one_ends(
    anyio_backend,
) -> None:
    seen = []  # `tasks` each time a task returned
    running = Running(lambda: seen.append(running.tasks))
    release = anyio.Event()

    async def waits() -> None:
        await release.wait()

    async def fails() -> None:
        raise KeyError("boom")

    with pytest.raises(BaseExceptionGroup) as caught:  # anyio 4: a task group's errors
        async with anyio.create_task_group() as tg:
            running.start(tg, waits)
            running.start(tg, waits)
            assert running.tasks == 2  # counted before either task first ran
            await anyio.sleep(0)
            release.set()
            await anyio.wait_all_tasks_blocked()
            assert (running.tasks, seen) == (0, [1, 0])
            running.start(tg, fails)  # an error ends it too; the task group's error says so
    assert [type(e) for e in caught.value.exceptions] == [KeyError]
    assert (running.tasks, seen) == (0, [1, 0])
    cells = [SimpleNamespace(name="c0", role="train", alive=True)]
    running.check("async", 2, 5, cells)  # a task failed: the run ends with its error instead
    running.failed = False
    with pytest.raises(RunStalled) as stalled:
        running.check("async", 2, 5, cells)
    assert str(stalled.value) == (
        "async: nothing runs after 2 of 5 steps and the policy starts nothing (cells: c0 train)"
    )


# -- batch formation: the simulator's third mode ------------------------------------------------

TASK = Task(
    task_id="suite/t", root="/nonexistent", instruction="", spec=msgspec.convert({}, TaskSpec)
)


def test_first_finished_without_streaming_trains_the_batch_once_it_is_full() -> None:
    form = BatchFormation(groups_per_batch=2, streaming=False, unstreamed="first_finished")
    g = [Group(i, TASK, 2) for i in range(5)]
    assert form.complete(g[3], 0) is False and not form.queue  # taken, held until full
    assert form.complete(g[1], 0) is True
    assert [x.index for x in form.queue] == [3, 1]
    assert form.complete(g[4], 0) is False and [x.index for x in form.backlog] == [4]
    form.queue.clear()
    assert form.next_step(1) is False and not form.queue  # group 4 taken, waits for one more
    assert form.complete(g[0], 1) is True and [x.index for x in form.queue] == [4, 0]
    with pytest.raises(ValueError, match="unstreamed='fifo'"):
        BatchFormation(groups_per_batch=2, streaming=False, unstreamed="fifo")


# -- one policy, one workload, both drivers --------------------------------------------------

B, G, STEPS, CAP = 4, 2, 3, 2
UNIT_S = 0.4
"""Wall seconds of one simulated second."""
SWITCH_S = 0.01  # the cell double's switch (fake_cells.FakeTrainingCell.switch_role)
DURATIONS = [
    *(2.8, 2.1, 2.3, 9.3, 3.1, 1.6, 1.9, 3.9, 0.9, 3.9, 2.5, 1.9, 2.5, 0.6, 0.8, 1.3, 3.1, 2.8),
    *(2.9, 3.7, 3.7, 1.3, 2.4, 2.7, 3.0, 1.4, 1.8, 3.2, 2.5, 0.8, 1.9, 1.9, 3.3, 1.8, 0.7, 1.5),
]
"""Execution k runs DURATIONS[k] units; execution 3 (group 1) is a straggler. Under each policy
below no two executions end less than 0.2 units (80 ms) apart in the simulator, so the wall
clock cannot reorder them on a loaded CPU (asserted: `MIN_GAP`)."""
MIN_GAP = 0.2


def sim_config(num_cells: int) -> SimConfig:
    """The cell doubles as a simulated cluster: no training, weight sync, optimizer or migration
    time; switches as long as the double's."""
    return msgspec.convert(
        {
            "name": "doubles",
            "cluster": {
                "num_cells": num_cells,
                "cell_peak_flops_per_s": 1e30,
                "train_mfu": 1.0,
                "kv_cache_bytes_per_cell": CAP * 1000,
            },
            "model": {
                "active_params": 1,
                "total_params": 1,
                "bytes_per_param": 1.0,
                "num_layers": 1,
                "attention_width": 1,
                "kv_bytes_per_token": 1.0,
            },
            "workload": {
                "num_steps": STEPS,
                "batch_executions": B,
                "group_size": G,
                "median_duration_s": 1.0,
                "sigma": 0.0,
                "timeout_s": 100.0,
                "decode_tokens_per_s": 0.0,
                "tool_tokens_per_s": 0.0,
                "prompt_tokens": 1000,
                "max_context_tokens": 1000,
            },
            "costs": {
                "weight_sync_bytes_per_s": 1e30,
                "kv_migration_bytes_per_s": 1e30,
                "optimizer_step_s": 0.0,
                "switch_to_train_s": SWITCH_S / UNIT_S,
                "switch_to_rollout_s": SWITCH_S / UNIT_S,
            },
        },
        SimConfig,
    )


def simulated_batches(config: SimConfig, policy, streaming: bool) -> list[list[int]]:
    workload = Workload(config)
    workload.duration_s = [float(d) for d in DURATIONS]
    workload.tokens = [config.workload.tokens(d) for d in workload.duration_s]
    workload.train_s = [config.train_s(t) for t in workload.tokens]
    sim = _Sim(config, policy, workload, streaming)
    r = sim.run()
    assert r.trained_executions == STEPS * B
    ends = sorted(sim.ex_end[: r.dispatched])
    assert min(b - a for a, b in zip(ends, ends[1:])) >= MIN_GAP - 1e-9
    return [sorted(groups) for groups in r.step_groups]


class TimedRollout:
    """Executions that run DURATIONS[k] units of wall time and end failed (nothing to train)."""

    async def run(self, task: Task, execution_id: str) -> Executed:
        k = int(execution_id[1 : execution_id.index("-")])
        await anyio.sleep(DURATIONS[k] * UNIT_S)
        return failed_execution(execution_id, task.task_id, "timed double")


class BatchRecorder:
    """A journal double: records the groups each step trained."""

    def __init__(self) -> None:
        self.steps: list[list[int]] = []

    def continue_clock(self, ledger) -> None:  # noqa: ANN001
        pass

    async def begin(self, state, *, tasks, ledger, rerun) -> bool:  # noqa: ANN001
        return False

    def finished(self, step, group, member, executed) -> None:  # noqa: ANN001
        pass

    async def checkpoint(self, state, trained) -> None:  # noqa: ANN001
        self.steps.append(sorted(trained))


async def runtime_batches(tmp_path: Path, policy, num_cells: int, streaming: bool):
    config = config_from_dict(
        {
            "run_dir": str(tmp_path),
            "seed": 1,
            "loop": {"steps": STEPS, "batch_executions": B, "group_size": G},
            "scheduler": {"capacity_per_cell": CAP, "streaming": streaming},
            "tasks": {"suites": [str(REPO / "examples/tasks/learnable")]},
        }
    )
    exchange = Exchange()
    fakes = [
        FakeTrainingCell(i, ScriptedEngine(eos_token_id=0, vocab_size=8), exchange)
        for i in range(num_cells)
    ]
    cells = [CellHandle(name=f"cell-{i}", client=f) for i, f in enumerate(fakes)]
    journal = BatchRecorder()
    async with Router({c.name: c.client for c in cells}, config=config.router) as router:
        runtime = ElasticRuntime(
            config=config,
            cells=cells,
            router=router,
            rollout=TimedRollout(),
            policy=policy,
            tasks=load_suite(REPO / "examples/tasks/learnable"),
            snapshot="model",
            journal=journal,
        )
        await runtime.run(STEPS)
    return journal.steps, runtime.statistics()


@pytest.mark.parametrize(
    ("policy", "num_cells", "streaming"),
    [
        (AsyncPolicy(num_train_cells=1, max_staleness_steps=1), 2, True),
        (AsyncPolicy(num_train_cells=1, max_staleness_steps=1), 2, False),
        (ElasticPolicy(max_staleness_steps=1), 3, True),
    ],
    ids=["async-streaming", "async-dispatched", "elastic"],
)
def test_the_simulator_and_the_runtime_form_the_same_batches(
    tmp_path: Path, policy, num_cells: int, streaming: bool
) -> None:
    config = sim_config(num_cells)
    if not streaming:  # the runtime's non-streaming batch is the dispatched groups
        config = msgspec.structs.replace(
            config,
            policies=msgspec.structs.replace(config.policies, unstreamed_batch="dispatched"),
        )
    expected = simulated_batches(config, policy, streaming)
    got, stats = anyio.run(runtime_batches, tmp_path, policy, num_cells, streaming)
    assert got == expected
    assert stats.steps_done == STEPS and stats.weight_version == STEPS
