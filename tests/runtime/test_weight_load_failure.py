"""A cell whose engine fails to load a step's weights (field case B17) on the elastic runtime.

Before, the step's `Router.load_weights` raised `WeightSyncError` out of the step and the run
stopped, even with other cells serving. Now the failed cell is out of service, tried once more,
and dropped like a dead cell when it fails again (its engine may hold half-loaded weights); a
satellite whose load fails while it switches to rollout is dropped too; on the core cell, or when
no other cell rolls out, the run stops with the error. Cells are `fake_cells.FakeTrainingCell`
doubles, as in `test_elastic`.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from gyre.errors import RunStalled, WeightSyncError, grouped_errors
from gyre.model.recipe import build_tokenizer
from gyre.routing.router import Router
from gyre.runtime.cell_handle import CellHandle, DrivenCell
from gyre.runtime.cell_training import load_published_weights, switch_role
from gyre.runtime.suspension import Suspension
from gyre.runtime.weight_version import WeightVersion
from tests.routing.test_router import _BadLoad, scripted
from tests.runtime.test_elastic import STEPS, check_accounting, config, drive, make_cells

pytestmark = pytest.mark.anyio
SLOW = [
    pytest.mark.slow,
    pytest.mark.parametrize("anyio_backend", ["trio"]),  # slow tier: the node's backend only
]


def slow(test):
    for mark in reversed(SLOW):
        test = mark(test)
    return test


def fail_loads(fake, failures: int | None) -> list[tuple[int, bool]]:
    """Make `fake`'s engine fail its first `failures` loads of a version >= 1 (None: every one).
    Returns the log of its loads: (version, succeeded)."""
    load = fake.engine.load_weights
    tries: list[tuple[int, bool]] = []

    async def load_weights(snapshot: str, version: int) -> None:
        failed_so_far = sum(not ok for _, ok in tries)
        if version >= 1 and (failures is None or failed_so_far < failures):
            tries.append((version, False))
            raise WeightSyncError(f"cell {fake.index}: tensor 3 of {snapshot}: wrong shape")
        await load(snapshot, version)
        tries.append((version, True))

    fake.engine.load_weights = load_weights
    return tries


@slow
async def test_a_load_that_fails_once_is_retried_and_the_cell_keeps_serving(tmp_path: Path) -> None:
    fakes = make_cells(build_tokenizer())
    tries = fail_loads(fakes[2], 1)
    runtime = await drive(config(tmp_path / "run", "async"), fakes)
    check_accounting(runtime, fakes, tmp_path / "run")
    # async: cells 1 and 2 roll out throughout, so each step's weights go to both
    assert tries == [(1, False), (1, True), (2, True), (3, True)]
    assert [c.alive for c in runtime.state.cells] == [True, True, True]
    router = runtime.router.statistics()
    assert router.cells_down == 0
    assert {c.name: c.weight_version for c in router.cells if c.role == "rollout"} == {
        "cell-1": STEPS,
        "cell-2": STEPS,
    }
    assert runtime.state.cells[2].engine_version == STEPS


@slow
async def test_a_cell_that_fails_its_load_twice_is_dropped_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    fakes = make_cells(build_tokenizer())
    tries = fail_loads(fakes[2], None)
    served = []
    load = fakes[2].engine.load_weights

    async def load_weights(snapshot: str, version: int) -> None:
        served.append(fakes[2].engine.statistics().requests_total)
        await load(snapshot, version)

    fakes[2].engine.load_weights = load_weights
    runtime = await drive(config(tmp_path / "run", "async"), fakes)
    check_accounting(runtime, fakes, tmp_path / "run")
    assert tries == [(1, False), (1, False)]  # tried twice at step 1, never again
    assert [c.alive for c in runtime.state.cells] == [True, True, False]
    stats = runtime.statistics()
    assert stats.steps_done == STEPS and stats.cells_dead == 1
    assert stats.roles[2] == "dead"
    # no request reached it after its first failed load
    assert fakes[2].engine.statistics().requests_total == served[0]
    (down,) = [c for c in runtime.router.statistics().cells if c.down is not None]
    assert down.name == "cell-2" and "wrong shape" in down.down


@slow
async def test_a_satellite_that_fails_its_load_switching_to_rollout_is_dropped(
    tmp_path: Path,
) -> None:
    # colocate: every cell trains every batch, then switches back to rollout with the new weights
    fakes = make_cells(build_tokenizer())
    tries = fail_loads(fakes[2], None)
    runtime = await drive(config(tmp_path / "run", "colocate"), fakes)
    check_accounting(runtime, fakes, tmp_path / "run")
    assert tries == [(1, False)]  # its switch back after step 1
    assert [c.alive for c in runtime.state.cells] == [True, True, False]
    assert fakes[2].switches == ["train"]  # it never rolled out again
    assert runtime.statistics().cells_dead == 1


@slow
async def test_a_core_cell_that_fails_its_load_stops_the_run(tmp_path: Path) -> None:
    fakes = make_cells(build_tokenizer())
    fail_loads(fakes[0], None)
    with pytest.raises(BaseException) as caught:
        await drive(config(tmp_path / "run", "colocate"), fakes)
    (error,) = grouped_errors(caught.value) or [caught.value]
    assert isinstance(error, WeightSyncError)
    assert str(error).startswith("cell-0, the core cell: cell 0: tensor 3 of ")
    assert str(error).endswith("/v1: wrong shape")


@slow
async def test_a_load_that_fails_twice_on_the_only_rollout_cell_stops_the_run(
    tmp_path: Path,
) -> None:
    # async, 2 cells: the core trains throughout and cell 1 is the only one rolling out; dropping
    # it would leave the run waiting for rollouts that never come
    fakes = make_cells(build_tokenizer(), n=2)
    tries = fail_loads(fakes[1], None)
    with pytest.raises(BaseException) as caught:
        await drive(config(tmp_path / "run", "async"), fakes)
    (error,) = grouped_errors(caught.value) or [caught.value]
    assert isinstance(error, WeightSyncError)
    assert str(error).startswith(
        "weight load of version 1 failed twice on every rollout cell: {'cell-1': 'cell 1: tensor"
    )
    assert tries == [(1, False), (1, False)]


def driven(index: int, name: str, executions: set[str], client=None) -> DrivenCell:
    cell = DrivenCell(index, CellHandle(name=name, client=client), version=0)
    cell.executions = set(executions)
    return cell


def pins(router: Router) -> dict[str, int]:
    return {c.name: c.executions for c in router.statistics().cells}


async def test_a_cell_that_loads_on_the_retry_gets_its_executions_pinned_again(
    anyio_backend,
) -> None:
    class FailsOnce(_BadLoad):
        async def load_weights(self, snapshot: str, version: int) -> None:
            try:
                await super().load_weights(snapshot, version)  # raises while `fail` is set
            finally:
                self.fail = False

    flaky = FailsOnce("a", scripted(0), [])
    async with Router({"a": flaky, "b": scripted(0)}) as router:
        cells = [driven(0, "a", {"x1", "x2"}), driven(1, "b", {"x3"})]
        for cell in cells:
            for execution_id in cell.executions:
                router.pin(execution_id, cell.name)
        assert pins(router) == {"a": 2, "b": 1}
        weights = WeightVersion(0, "snap0")
        weights.publish(1, "snap1")
        # the first try fails and marks `a` down, which unpins its executions; the retry loads
        assert await load_published_weights(router, cells, weights) == {}
        assert pins(router) == {"a": 2, "b": 1}
        assert [c.engine_version for c in cells] == [1, 1]
        stats = router.statistics()
        assert (stats.cells_down, stats.weight_loads_failed, stats.weight_loads) == (0, 1, 1)
        assert flaky.inner.weight_version == 1


async def test_a_load_that_fails_twice_on_every_rollout_cell_is_one_error(anyio_backend) -> None:
    async with Router(
        {"a": _BadLoad("a", scripted(0), []), "b": _BadLoad("b", scripted(0), [])}
    ) as (router):
        cells = [driven(0, "a", set()), driven(1, "b", set())]
        weights = WeightVersion(0, "snap0")
        weights.publish(1, "snap1")
        with pytest.raises(WeightSyncError) as caught:
            await load_published_weights(router, cells, weights)
        assert str(caught.value) == (
            "weight load of version 1 failed twice on every rollout cell: "
            "{'a': 'tensor 3 of snap1: wrong shape', 'b': 'tensor 3 of snap1: wrong shape'}"
        )
        assert [c.engine_version for c in cells] == [0, 0]
        assert router.statistics().weight_loads_failed == 4


async def test_a_cell_that_switches_to_rollout_and_loads_is_back_in_service(anyio_backend) -> None:
    # a step's load failed on it (down), then it switched to training before the retry; the
    # load of its switch back to rollout succeeds, so it serves again
    fake = make_cells(build_tokenizer(), n=1)[0]
    async with Router({"cell-0": fake.engine}) as router:
        router.mark_down("cell-0", "weight load of version 1 failed: wrong shape")
        await router.set_role("cell-0", "train")
        await fake.switch_role("train")
        cell = driven(0, "cell-0", set(), client=fake)
        weights = WeightVersion(0, "snap0")
        weights.publish(1, "snap1")
        await switch_role(cell, "rollout", core=cell, weights=weights, router=router)
        stats = router.statistics()
        assert (stats.cells_down, stats.cells_rollout) == (0, 1)
        assert cell.engine_version == fake.engine.weight_version == 1
        # the router reports the version the switch loaded in the cell, not the one before
        assert stats.weight_version == stats.cells[0].weight_version == 1


def test_a_lost_cells_executions_go_to_a_survivor_or_wait_for_a_cell_switching_in() -> None:
    held = []
    router = SimpleNamespace(hold=held.append)
    lost = SimpleNamespace(index=0, name="a", role="dead", executions={"x2", "x1"}, target=None)
    pinned = []

    def pin(execution_id, cell):
        cell.executions.add(execution_id)
        pinned.append((execution_id, cell.name))

    # a survivor in rollout takes them all, beyond any capacity
    survivor = SimpleNamespace(index=1, name="b", role="rollout", executions={"x9"}, target=None)
    Suspension(router).rehome(lost, [survivor], pin)
    assert pinned == [("x1", "b"), ("x2", "b")] and lost.executions == set() and held == []
    # none in rollout, one switching to it: they are suspended and resume there
    lost.executions = {"x2", "x1"}
    switching = SimpleNamespace(
        index=1, name="b", role="switching", executions=set(), target="rollout"
    )
    suspension = Suspension(router)
    suspension.rehome(lost, [switching], pin)
    assert held == ["x1", "x2"] and list(suspension.queue) == ["x1", "x2"]
    assert suspension.suspensions == 2 and lost.executions == set()
    # none in rollout or switching to it: nothing could run them
    lost.executions = {"x1"}
    training = SimpleNamespace(index=1, name="b", role="train", executions=set(), target=None)
    with pytest.raises(RunStalled, match="no rollout cell to move cell a.s executions to"):
        Suspension(router).rehome(lost, [training], pin)
    lost.executions = set()  # nothing to move: nothing to say
    Suspension(router).rehome(lost, [training], pin)
