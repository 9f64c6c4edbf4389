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
