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

import pytest

from gyre.errors import WeightSyncError, grouped_errors
from gyre.model.recipe import build_tokenizer
from tests.runtime.test_elastic import STEPS, check_accounting, config, drive, make_cells

pytestmark = [
    pytest.mark.slow,
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", ["trio"]),  # slow tier: the node's backend only
]


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


async def test_a_load_that_fails_once_is_retried_and_the_cell_keeps_serving(tmp_path: Path) -> None:
    fakes = make_cells(build_tokenizer())
    tries = fail_loads(fakes[2], 1)
    runtime = await drive(config(tmp_path / "run", "async"), fakes)
    check_accounting(runtime, fakes, tmp_path / "run")
    # async: cells 1 and 2 roll out throughout, so each step's weights go to both
    assert tries == [(1, False), (1, True), (2, True), (3, True)]
    assert [c.alive for c in runtime.cells] == [True, True, True]
    router = runtime.router.statistics()
    assert router.cells_down == 0
    assert {c.name: c.weight_version for c in router.cells if c.role == "rollout"} == {
        "cell-1": STEPS,
        "cell-2": STEPS,
    }
    assert runtime.cells[2].engine_version == STEPS


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
    assert [c.alive for c in runtime.cells] == [True, True, False]
    stats = runtime.statistics()
    assert stats.steps_done == STEPS and stats.cells_dead == 1
    assert stats.roles[2] == "dead"
    # no request reached it after its first failed load
    assert fakes[2].engine.statistics().requests_total == served[0]
    (down,) = [c for c in runtime.router.statistics().cells if c.down is not None]
    assert down.name == "cell-2" and "wrong shape" in down.down


async def test_a_satellite_that_fails_its_load_switching_to_rollout_is_dropped(
    tmp_path: Path,
) -> None:
    # colocate: every cell trains every batch, then switches back to rollout with the new weights
    fakes = make_cells(build_tokenizer())
    tries = fail_loads(fakes[2], None)
    runtime = await drive(config(tmp_path / "run", "colocate"), fakes)
    check_accounting(runtime, fakes, tmp_path / "run")
    assert tries == [(1, False)]  # its switch back after step 1
    assert [c.alive for c in runtime.cells] == [True, True, False]
    assert fakes[2].switches == ["train"]  # it never rolled out again
    assert runtime.statistics().cells_dead == 1


async def test_a_core_cell_that_fails_its_load_stops_the_run(tmp_path: Path) -> None:
    fakes = make_cells(build_tokenizer())
    fail_loads(fakes[0], None)
    with pytest.raises(BaseException) as caught:
        await drive(config(tmp_path / "run", "colocate"), fakes)
    (error,) = grouped_errors(caught.value) or [caught.value]
    assert isinstance(error, WeightSyncError)
    assert str(error).startswith("cell-0, the core cell: cell 0: tensor 3 of ")
    assert str(error).endswith("/v1: wrong shape")


async def test_the_last_cell_to_roll_out_that_fails_its_load_stops_the_run(tmp_path: Path) -> None:
    # async, 2 cells: the core trains throughout and cell 1 is the only one rolling out; dropping
    # it would leave the run waiting for rollouts that never come
    fakes = make_cells(build_tokenizer(), n=2)
    tries = fail_loads(fakes[1], None)
    with pytest.raises(BaseException) as caught:
        await drive(config(tmp_path / "run", "async"), fakes)
    (error,) = grouped_errors(caught.value) or [caught.value]
    assert isinstance(error, WeightSyncError)
    assert str(error).startswith(
        "cell-1, the last cell to roll out: weight load of version 1 failed twice: cell 1: "
    )
    assert tries == [(1, False), (1, False)]
