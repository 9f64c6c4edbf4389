"""Simulator mechanics against hand-computed timelines, and its bookkeeping invariants."""

from __future__ import annotations

import math

import pytest

from gyre.runtime.scheduler import AsyncPolicy, ColocatePolicy, ElasticPolicy
from gyre.sim.config import SimConfig
from gyre.sim.engine import SimulationStalled, Workload, simulate
from tests.sim.conftest import replace

D, TRAIN, SYNC, OPT = 100.0, 6.006, 10.0, 5.0  # the `tiny` scenario (tests/sim/conftest.py)
TO_TRAIN, TO_ROLLOUT = 8.52, 3.46


def test_colocate_timeline_by_hand(tiny: SimConfig) -> None:
    # Per step: roll out 4 executions on 2 x 2 slots (100 s), all cells to train (8.52 s), two
    # rounds of micro-batches on 2 cells (2 x 6.006 s), optimizer (5 s); between steps all cells
    # go back to rollout (3.46 s) and load the new weights in that switch.
    r = simulate(tiny, ColocatePolicy())
    step = D + TO_TRAIN + 2 * TRAIN + OPT
    assert r.step_end_s == pytest.approx((step, 2 * step + TO_ROLLOUT))
    assert r.switches == 2 + 2 + 2  # both cells to train, back to rollout, to train again
    assert r.trained_executions == 8 and r.dispatched == 8


def test_async_timeline_by_hand(tiny: SimConfig) -> None:
    # 1 training cell (the core), 1 rollout cell with 2 slots, on-policy (k = 0), no streaming:
    # a batch of 4 takes two 100 s waves, then 4 micro-batches on the core, then the optimizer;
    # the rollout cell loads the new weights (10 s) before the next batch starts.
    r = simulate(tiny, AsyncPolicy(num_train_cells=1, max_staleness_steps=0))
    first = 2 * D + 4 * TRAIN + OPT
    assert r.step_end_s == pytest.approx((first, first + SYNC + first))
    assert r.switches == 0 and r.migrations == 0


def test_streaming_trains_the_first_group_during_the_second_wave(tiny: SimConfig) -> None:
    # With streaming the first group's 2 micro-batches run while the second wave rolls out.
    r = simulate(tiny, AsyncPolicy(num_train_cells=1, max_staleness_steps=0), streaming=True)
    first = 2 * D + 2 * TRAIN + OPT
    assert r.step_end_s == pytest.approx((first, first + SYNC + first))


def test_makespan_never_beats_the_lower_bound(longtail: SimConfig) -> None:
    for sigma in (0.0, 0.5, 1.0, 1.5):
        for seed in (0, 1):
            config = replace(
                longtail, workload__sigma=sigma, workload__seed=seed, workload__num_steps=6
            )
            workload = Workload(config)
            for policy in (
                ColocatePolicy(),
                AsyncPolicy(num_train_cells=3),
                ElasticPolicy(max_staleness_steps=1),
            ):
                r = simulate(config, policy, workload)
                assert r.makespan_s >= r.lower_bound_s * (1 - 1e-12), (sigma, seed, policy.name)
                assert 0 < r.utilisation <= 1 + 1e-9
                assert r.trained_executions == 6 * config.workload.batch_executions


def test_every_policy_sees_the_same_durations_and_runs_are_deterministic(
    longtail: SimConfig,
) -> None:
    config = replace(longtail, workload__num_steps=4)
    a = simulate(config, ElasticPolicy(max_staleness_steps=1))
    b = simulate(config, ElasticPolicy(max_staleness_steps=1), Workload(config))
    assert a == b
    w1, w2 = Workload(config), Workload(config)
    w1.ensure(10)  # draws in two chunks (256, then 344) ...
    w1.ensure(600)
    w2.ensure(600)  # ... and in one: the same durations
    assert w1.duration_s[:600] == w2.duration_s[:600]
    assert max(w2.duration_s) <= config.workload.timeout_s


def test_elastic_migrates_and_records_its_switches(longtail: SimConfig) -> None:
    r = simulate(replace(longtail, workload__num_steps=4), ElasticPolicy(max_staleness_steps=1))
    kinds = {iv.kind for iv in r.timeline.intervals}
    assert {"rollout", "switch", "train", "step"} <= kinds
    assert r.switches > 0
    # One switch at a time: switch intervals never overlap.
    spans = sorted((iv.start_s, iv.end_s) for iv in r.timeline.intervals if iv.kind == "switch")
    assert all(b0 >= a1 - 1e-9 for (_, a1), (b0, _) in zip(spans, spans[1:], strict=False))
    assert max(r.timeline.water_level) <= max(r.timeline.rollout_capacity)


def test_a_policy_that_cannot_switch_stalls_loudly(longtail: SimConfig) -> None:
    config = replace(longtail, costs__switch_to_train_s=math.inf, workload__num_steps=2)
    unpinned = ElasticPolicy(switch_cost_s=math.inf, max_switch_cost_s=math.inf)
    with pytest.raises(SimulationStalled, match="after 0 of 2 steps"):
        simulate(config, unpinned)


def test_a_policy_asking_for_too_much_is_refused(tiny: SimConfig) -> None:
    class Greedy(AsyncPolicy, frozen=True):
        def decide(self, state):  # noqa: ANN001 - test double
            from gyre.runtime.scheduler import Dispatch

            return (Dispatch(state.free_slots + 1),)

    with pytest.raises(ValueError, match="exceeds free slots"):
        simulate(tiny, Greedy(num_train_cells=1, name="async"))


def scripted(config: SimConfig, durations: list[float]) -> Workload:
    """A workload whose execution `i` runs `durations[i]` seconds (tokens and training follow)."""
    workload = Workload(config)
    workload.duration_s = list(durations)
    workload.tokens = [config.workload.tokens(d) for d in durations]
    workload.train_s = [config.train_s(t) for t in workload.tokens]
    return workload


STRAGGLER = [D, D, D, 10 * D] + [D] * 12  # execution 3 (group 1) runs 1000 s, every other 100 s


def test_colocate_on_policy_waits_for_the_straggler(tiny: SimConfig) -> None:
    # k = 0: the step dispatches executions 0-3 and trains when 3 finishes at 1000 s; then back
    # to rollout (3.46 s) and executions 4-7 take 100 s. Streaming cannot help: the batch is
    # exactly the step's own executions.
    r = simulate(tiny, ColocatePolicy(), scripted(tiny, STRAGGLER), streaming=True)
    step = TO_TRAIN + 2 * TRAIN + OPT
    first = 10 * D + step
    assert r.step_end_s == pytest.approx((first, first + TO_ROLLOUT + D + step))
    assert r.suspensions == 0


def test_colocate_partial_rollouts_carry_the_straggler_over(tiny: SimConfig) -> None:
    # k = 1, streaming. t=0: executions 0-3 start (0, 2 on cell 0; 1, 3 on cell 1). t=100: 0-2
    # finish, group 0 is in; 4, 5, 6 take the freed slots. t=200: group 2 (4, 5) completes the
    # batch {0, 2}; both cells switch to train and execution 3 (800 s left) is suspended. Step 1
    # ends at 200 + 8.52 + 2 x 6.006 + 5. Back to rollout (3.46 s): 3 resumes (ends 800 s later),
    # 7, 8, 9 start; at +100 s groups 3 (6, 7) and 4 (8, 9) are the batch and 3 is suspended
    # again with 700 s left. On-policy Colocate takes 1154.5 s for the same two steps.
    r = simulate(
        tiny, ColocatePolicy(max_staleness_steps=1), scripted(tiny, STRAGGLER), streaming=True
    )
    step = TO_TRAIN + 2 * TRAIN + OPT
    first = 2 * D + step
    assert r.step_end_s == pytest.approx((first, first + TO_ROLLOUT + D + step), abs=1e-6)
    assert r.suspensions == 2  # execution 3, at both switches to train
    assert r.dispatched == 10 and r.trained_executions == 8
    assert r.max_staleness_steps == 1  # execution 6 started at version 0, trained in step 2
    # No cell trains during Colocate's rollout, so streaming and a first-finished batch agree.
    unstreamed = simulate(
        tiny, ColocatePolicy(max_staleness_steps=1), scripted(tiny, STRAGGLER), streaming=False
    )
    assert unstreamed.step_end_s == r.step_end_s


def test_first_finished_batch_lets_async_train_past_a_straggler(tiny: SimConfig) -> None:
    # Async, 1 training cell, 1 rollout cell of 2 slots, k = 1, not streaming. The straggler 3
    # holds one slot from 100 s to 1100 s (+10 s weight sync at the first update); the other
    # slot runs 4, 5, 6, ... back to back.
    policy = AsyncPolicy(num_train_cells=1, max_staleness_steps=1)
    step = 4 * TRAIN + OPT
    # First finished (AReaL): batch 1 = groups 0 (done 100 s) and 2 (4, 5: done 400 s), trained
    # at 400 s; 6 ends 500 + 10 s (weight sync at the update), 7 ends 610 s, group 4 (8, 9) at
    # 810 s completes batch 2 = groups 3, 4.
    first_finished = simulate(tiny, policy, scripted(tiny, STRAGGLER))
    assert first_finished.step_end_s == pytest.approx((4 * D + step, 8 * D + SYNC + step))
    # Dispatched batches (the node runtime's non-streaming mode): batch 1 = groups 0, 1 waits for
    # 3 at 1100 s; groups 2, 3 (done by 600 s) are batch 2, trained right after the update.
    dispatched = replace(tiny, policies__unstreamed_batch="dispatched")
    r = simulate(dispatched, policy, scripted(dispatched, STRAGGLER))
    assert r.step_end_s == pytest.approx((11 * D + step, 11 * D + 2 * step))


def test_elastic_never_suspends(longtail: SimConfig) -> None:
    # Elastic's water rule only moves a cell whose executions fit on the others.
    r = simulate(replace(longtail, workload__num_steps=6), ElasticPolicy(max_staleness_steps=1))
    assert r.suspensions == 0 and r.migrations > 0
