"""Scheduler policies on hand-built snapshots: water level 0, at capacity, empty training queue,
a straggler; plus the snapshot's own validation and the public API of gyre.runtime."""

from __future__ import annotations

import math
import types

import pytest

import gyre.runtime
from gyre.runtime.scheduler import (
    AsyncPolicy,
    CellView,
    ColocatePolicy,
    Dispatch,
    ElasticPolicy,
    SchedulerPolicy,
    SchedulerState,
    StartStep,
    SwitchToRollout,
    SwitchToTrain,
    admission_room,
)

CAP = 4  # executions per rollout cell
B = 8  # executions per step


def state(
    roles: str,
    executions: tuple[int, ...] | None = None,
    *,
    busy: str = "",
    finished: int = 0,
    extra_dispatched: int = 0,
    steps_done: int = 0,
    ready: int = 0,
    running: int = 0,
    trained: int = 0,
    step_running: bool = False,
    suspended: int = 0,
) -> SchedulerState:
    """Cells from a role string: r = rollout, t = train, > = switching to train, < = to rollout.

    Cell 0 is the core. `busy` marks training cells busy by position ("b" or "."). The water level
    is the sum of `executions` plus `suspended`; `dispatched = finished + water level +
    extra_dispatched` is not allowed (the snapshot checks it), so `extra_dispatched` only exists
    to test that check.
    """
    executions = executions or (0,) * len(roles)
    cells = []
    for i, (r, n) in enumerate(zip(roles, executions, strict=True)):
        role = {"r": "rollout", "t": "train", ">": "switching", "<": "switching"}[r]
        target = {">": "train", "<": "rollout"}.get(r)
        cells.append(
            CellView(
                index=i,
                role=role,
                is_core=i == 0,
                switching_to=target,
                executions=n,
                busy=i < len(busy) and busy[i] == "b",
            )
        )
    water = sum(executions) + suspended
    return SchedulerState(
        cells=tuple(cells),
        capacity_per_cell=CAP,
        batch_executions=B,
        dispatched=finished + water + extra_dispatched,
        finished=finished,
        steps_done=steps_done,
        train_ready=ready,
        train_running=running,
        trained=trained,
        step_running=step_running,
        suspended=suspended,
    )


# ---- the snapshot -------------------------------------------------------------------------------


def test_snapshot_derived_quantities() -> None:
    s = state("trrr", (0, 4, 3, 1), finished=5)
    assert s.water_level == 8
    assert s.rollout_capacity == 3 * CAP == 12
    assert s.free_slots == 12 - 8 == 4
    assert s.core.index == 0 and not s.any_switching
    assert [c.index for c in s.idle_trainers] == [0]


def test_snapshot_rejects_inconsistent_states() -> None:
    with pytest.raises(ValueError, match="water level"):
        state("rr", (1, 1), extra_dispatched=1)
    with pytest.raises(ValueError, match="exceeds capacity_per_cell"):
        state("rr", (CAP + 1, 0))
    with pytest.raises(ValueError, match="only rollout cells host executions"):
        CellView(index=0, role="train", executions=1)
    with pytest.raises(ValueError, match="names its target role"):
        CellView(index=0, role="switching")
    with pytest.raises(ValueError, match="exactly one cell must be the core"):
        SchedulerState(
            cells=(CellView(index=0, role="rollout"), CellView(index=1, role="rollout")),
            capacity_per_cell=CAP,
            batch_executions=B,
            dispatched=0,
            finished=0,
        )
    with pytest.raises(ValueError, match="n=0"):
        Dispatch(0)


def test_suspended_executions_count_in_the_water_level() -> None:
    s = state("rr", (1, 0), suspended=3, finished=2)
    assert s.water_level == 4 and s.dispatched == 6
    assert s.free_slots == 2 * CAP - 4 == 4  # suspended executions resume into those first
    with pytest.raises(ValueError, match="suspended=-1 must be >= 0"):
        SchedulerState(
            cells=(CellView(index=0, role="rollout", is_core=True, executions=1),),
            capacity_per_cell=CAP,
            batch_executions=B,
            dispatched=0,
            finished=0,
            suspended=-1,
        )


def test_admission_room_is_areal_bound() -> None:
    # (steps_done + 1 + k) * B - dispatched, floored at 0.
    s = state("rrrr", (2, 2, 2, 2), finished=8, steps_done=1)  # dispatched 16
    assert admission_room(s, 0) == (1 + 1 + 0) * B - 16 == 0
    assert admission_room(s, 1) == (1 + 1 + 1) * B - 16 == 8
    assert admission_room(s, 2) == 16


def test_policies_satisfy_the_protocol() -> None:
    for p in (ColocatePolicy(), AsyncPolicy(num_train_cells=1), ElasticPolicy()):
        assert isinstance(p, SchedulerPolicy)


def test_runtime_exports_exactly_its_all() -> None:
    public = {
        n
        for n in dir(gyre.runtime)
        if not n.startswith("_") and not isinstance(getattr(gyre.runtime, n), types.ModuleType)
    }
    assert public == set(gyre.runtime.__all__)


# ---- Colocate ------------------------------------------------------------------------------------


def test_colocate_water_level_zero_dispatches_one_batch() -> None:
    # 4 rollout cells x 4 slots = 16 free; on-policy admission gives exactly one batch (8).
    assert ColocatePolicy().decide(state("rrrr")) == (Dispatch(B),)


def test_colocate_at_capacity_waits() -> None:
    assert ColocatePolicy().decide(state("rr", (CAP, CAP))) == ()


def test_colocate_empty_training_queue_waits() -> None:
    assert ColocatePolicy().decide(state("rrrr", (1, 1, 1, 1), finished=4)) == ()


def test_colocate_straggler_holds_every_cell() -> None:
    # 7 of 8 ready (streamed), one straggler: colocate does not switch until the batch is whole.
    assert ColocatePolicy().decide(state("rrrr", (1, 0, 0, 0), finished=7, ready=7)) == ()


def test_colocate_whole_batch_switches_every_cell_then_steps_then_returns() -> None:
    p = ColocatePolicy()
    assert p.decide(state("rrrr", finished=8, ready=8)) == tuple(SwitchToTrain(i) for i in range(4))
    assert p.decide(state("tttt", finished=8, trained=8)) == (StartStep(),)
    assert p.decide(state("tttt", busy="b", finished=8, trained=8, step_running=True)) == ()
    after_step = state("tttt", finished=8, steps_done=1)
    assert p.decide(after_step) == tuple(SwitchToRollout(i) for i in range(4))


def test_colocate_partial_rollouts_fill_the_slots_past_the_batch() -> None:
    p = ColocatePolicy(max_staleness_steps=1)
    # 16 free slots, room for two batches (k = 1): 16 start, not 8.
    assert p.decide(state("rrrr")) == (Dispatch(2 * B),)
    # 5 of the first batch finished, 3 run: the 13 free slots take the next batch's 8.
    assert p.decide(state("rrrr", (1, 1, 1, 0), finished=5)) == (Dispatch(B),)
    assert ColocatePolicy().decide(state("rrrr", (1, 1, 1, 0), finished=5)) == ()
    with pytest.raises(ValueError, match="max_staleness_steps=-1"):
        ColocatePolicy(max_staleness_steps=-1)


def test_colocate_partial_rollouts_switch_with_executions_running() -> None:
    # The batch (first 8 to finish) is in while 3 executions still run: every cell trains; the
    # driver suspends the 3 and resumes them after the update.
    p = ColocatePolicy(max_staleness_steps=1)
    assert p.decide(state("rrrr", (2, 1, 0, 0), finished=8, ready=8)) == tuple(
        SwitchToTrain(i) for i in range(4)
    )
    after_step = state("tttt", suspended=3, finished=8, steps_done=1)
    assert p.decide(after_step) == tuple(SwitchToRollout(i) for i in range(4))
    # Back in rollout the 3 suspended count against the 16 slots: 13 free, room 3 x 8 - 11.
    assert p.decide(state("rrrr", suspended=3, finished=8, steps_done=1)) == (Dispatch(13),)


def test_colocate_returns_to_rollout_after_training_carried_over_groups() -> None:
    # After the update 4 carried-over executions were trained at once; the rest of the batch is
    # still to roll out, so every cell goes back (their gradients wait on the cells).
    p = ColocatePolicy(max_staleness_steps=1)
    assert p.decide(state("tttt", suspended=4, finished=12, steps_done=1, trained=4)) == tuple(
        SwitchToRollout(i) for i in range(4)
    )
    assert p.decide(state("tttt", busy="b", finished=12, steps_done=1, running=1, trained=3)) == ()


# ---- Async ---------------------------------------------------------------------------------------


def test_async_initial_split_puts_the_core_in_training() -> None:
    assert AsyncPolicy(num_train_cells=2).initial_roles(4, 0) == (
        "train",
        "train",
        "rollout",
        "rollout",
    )
    assert AsyncPolicy(num_train_cells=1).initial_roles(3, 2) == ("rollout", "rollout", "train")
    with pytest.raises(ValueError, match="num_train_cells=4"):
        AsyncPolicy(num_train_cells=4).initial_roles(4, 0)


def test_async_water_level_zero_fills_its_rollout_cells() -> None:
    # 2 rollout cells = 8 slots; admission with k=1 allows 2 batches = 16: slots bind.
    assert AsyncPolicy(num_train_cells=2).decide(state("ttrr")) == (Dispatch(8),)


def test_async_at_capacity_does_nothing() -> None:
    assert AsyncPolicy(num_train_cells=2).decide(state("ttrr", (0, 0, CAP, CAP))) == ()


def test_async_staleness_bound_stops_dispatch() -> None:
    # Version 0, 16 dispatched (= (0 + 1 + 1) * 8), 12 finished: 4 slots free, admission closed.
    s = state("ttrr", (0, 0, 2, 2), finished=12, ready=4, busy="bb")
    assert AsyncPolicy(num_train_cells=2).decide(s) == ()
    assert AsyncPolicy(num_train_cells=2, max_staleness_steps=2).decide(s) == (Dispatch(4),)


def test_async_empty_queue_and_straggler_never_switch() -> None:
    p = AsyncPolicy(num_train_cells=2, max_staleness_steps=0)
    assert p.decide(state("ttrr", (0, 0, 1, 0), finished=7, ready=0)) == ()
    assert p.decide(state("ttrr", (0, 0, 1, 0), finished=7, ready=7, busy="bb")) == ()


def test_async_steps_when_the_batch_is_trained() -> None:
    assert AsyncPolicy(num_train_cells=2, max_staleness_steps=0).decide(
        state("ttrr", finished=8, trained=8)
    ) == (StartStep(),)


# ---- Elastic ------------------------------------------------------------------------------------


def test_elastic_water_level_zero_dispatches_into_every_cell() -> None:
    assert ElasticPolicy().initial_roles(4, 0) == ("rollout",) * 4
    assert ElasticPolicy(max_staleness_steps=0).decide(state("rrrr")) == (Dispatch(B),)
    # k = 1 admits two batches, 16 = all slots.
    assert ElasticPolicy(max_staleness_steps=1).decide(state("rrrr")) == (Dispatch(16),)


def test_elastic_at_capacity_keeps_rolling_out_even_with_data_waiting() -> None:
    # w = 16 = C_R: a switch would leave nowhere for a cell's executions.
    s = state("rrrr", (4, 4, 4, 4), finished=0, ready=0)
    assert ElasticPolicy().decide(s) == ()
    # One group done (ready 2), w = 14 > C_R - C_e = 12: still no switch, and no refill
    # (training first: the water level must fall).
    s = state("rrrr", (4, 4, 3, 3), finished=2, ready=2)
    assert ElasticPolicy(max_staleness_steps=1).decide(s) == ()


def test_elastic_switches_the_core_first_exactly_at_the_water_mark() -> None:
    p = ElasticPolicy(max_staleness_steps=0)
    at_mark = state("rrrr", (3, 3, 3, 3), finished=4, ready=4)  # w = 12 = 16 - 4
    assert p.decide(at_mark) == (SwitchToTrain(0),)
    above = state("rrrr", (4, 3, 3, 3), finished=3, ready=3)  # w = 13
    assert p.decide(above) == ()


def test_elastic_empty_training_queue_does_not_switch() -> None:
    assert (
        ElasticPolicy(max_staleness_steps=0).decide(state("rrrr", (1, 1, 0, 0), finished=6)) == ()
    )


def test_elastic_straggler_pulls_cells_into_training_one_at_a_time() -> None:
    p = ElasticPolicy(max_staleness_steps=0)
    # Core trains, 5 executions wait, one straggler on cell 3: the emptiest rollout cell goes next.
    s = state("trrr", (0, 0, 0, 1), busy="b", finished=7, ready=5)
    assert p.decide(s) == (SwitchToTrain(1),)
    # While cell 1 switches, nothing else switches.
    s = state("t>rr", (0, 0, 0, 1), busy="b", finished=7, ready=5)
    assert p.decide(s) == ()
    # Last rollout cell hosts the straggler: it stays (w = 1 > (1 - 1) * 4).
    s = state("tttr", (0, 0, 0, 1), busy="bbb", finished=7, ready=2)
    assert p.decide(s) == ()


def test_elastic_no_switch_when_an_idle_trainer_can_take_the_data() -> None:
    s = state("ttrr", (0, 0, 1, 0), busy="b.", finished=7, ready=1)
    assert ElasticPolicy(max_staleness_steps=0).decide(s) == ()


def test_elastic_returns_satellites_when_new_executions_need_room() -> None:
    p = ElasticPolicy(max_staleness_steps=0)
    # After step 1: all 8 trained and stepped, 3 trainers idle, one rollout cell (4 free slots).
    s = state("tttr", finished=8, steps_done=1)
    assert p.decide(s) == (Dispatch(CAP), SwitchToRollout(2))
    # Satellites busy, the idle core already holds gradients of the new step: nobody returns.
    s = state("tttr", finished=8, steps_done=1, trained=1, running=2, busy=".bb")
    assert p.decide(s) == (Dispatch(CAP),)


def test_elastic_core_returns_last() -> None:
    p = ElasticPolicy(max_staleness_steps=1)
    # Version 1, 16 dispatched, 10 in flight: room (1 + 1 + 1) * 8 - 16 = 8 > 2 free slots, and
    # nothing of the new step is on the core yet, so the core itself goes back to rollout.
    s = state("trrr", (0, 4, 4, 2), finished=6, steps_done=1)
    assert p.decide(s) == (Dispatch(2), SwitchToRollout(0))
    # Same, but a micro-batch of the new step already ran on the core: it stays.
    s = state("trrr", (0, 4, 4, 2), finished=6, steps_done=1, trained=1)
    assert p.decide(s) == (Dispatch(2),)


def test_elastic_starts_the_step_on_the_core() -> None:
    s = state("ttrr", finished=8, trained=8)
    assert ElasticPolicy(max_staleness_steps=0).decide(s)[0] == StartStep()


def test_elastic_pins_a_fixed_split_when_switching_cannot_pay() -> None:
    p = ElasticPolicy(switch_cost_s=math.inf, fallback_train_cells=2, max_staleness_steps=1)
    assert p.pinned
    assert p.initial_roles(4, 0) == ("train", "train", "rollout", "rollout")
    twin = AsyncPolicy(num_train_cells=2, max_staleness_steps=1)
    for s in (state("ttrr"), state("ttrr", (0, 0, 4, 4)), state("ttrr", finished=8, trained=8)):
        assert p.decide(s) == twin.decide(s)
    assert not ElasticPolicy().pinned  # the published 8.52 + 3.46 s


def test_elastic_calls_the_core_back_when_satellites_hold_the_steps_gradients() -> None:
    """Satellites trained (or train) the step while the core rolls out: the core must go back to
    receive their gradients and step, or the step never happens."""
    policy = ElasticPolicy()
    # 2 groups trained on satellite 1 (trained = B), nothing waiting; the core hosts 2 executions
    # that fit on cell 2 (capacity 4): the core switches to train
    s = state("rtr", (2, 0, 1), trained=B, finished=3 * B + 5, steps_done=3)
    assert SwitchToTrain(0) in policy.decide(s)
    # a satellite is still computing a micro-batch of the step: same answer
    s = state("rtr", (2, 0, 1), busy=".b.", running=1, finished=3 * B + 5, steps_done=3)
    assert SwitchToTrain(0) in policy.decide(s)
    # no gradient of the step anywhere: the core may keep rolling out
    s = state("rtr", (2, 0, 1), finished=3 * B + 5, steps_done=3)
    assert not any(isinstance(a, SwitchToTrain) for a in policy.decide(s))
