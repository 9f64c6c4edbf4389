"""The run timeline: the JSON-lines file round-trips, survives torn writes, and utilisation equals
values computed by hand on a two-cell, two-step timeline."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import gyre.sim
import gyre.sim.engine
from gyre.runtime.timeline import (
    TIMELINE_FILE,
    Interval,
    RoleChange,
    Timeline,
    TimelineWriter,
    read_timeline,
    utilisation,
    utilisation_per_step,
)


def write_two_steps(run_dir: Path, *, tags: tuple[int | None, int | None] = (1, 2)) -> None:
    """Two cells, two steps (0-10 s and 10-14 s); the numbers in the tests below come from here.

    cell 0: rollout 0-4, switch 4-5, train 5-8, step 8-10, train 10-12, step 12-14
    cell 1: rollout 0-9 and 8-11 (overlap 8-9 counted once), load 4-5 (inside rollout), idle 11-14
    water: (level, capacity) = (3, 4) from 0, (3, 2) from 4, (1, 2) from 6, (0, 2) from 11
    """
    with TimelineWriter(run_dir) as w:
        w.role(0.0, 0, "rollout")
        w.role(0.0, 1, "rollout")
        w.water(0.0, 3, 4)
        w.interval(0, 0.0, 4.0, "rollout")
        w.role(4.0, 0, "switching")
        w.water(4.0, 3, 2)
        w.interval(0, 4.0, 5.0, "switch")
        w.role(5.0, 0, "train")
        w.interval(1, 4.0, 5.0, "load")
        w.water(6.0, 1, 2)
        w.interval(0, 5.0, 8.0, "train", step=1)
        w.interval(0, 8.0, 10.0, "step", step=tags[0])
        w.interval(1, 0.0, 9.0, "rollout")
        w.interval(0, 10.0, 12.0, "train", step=2)
        w.interval(1, 8.0, 11.0, "rollout")
        w.water(11.0, 0, 2)
        w.interval(1, 11.0, 14.0, "idle")
        w.interval(0, 12.0, 14.0, "step", step=tags[1])


def test_file_round_trip(tmp_path: Path) -> None:
    write_two_steps(tmp_path)
    t = read_timeline(tmp_path)
    assert t.intervals[:3] == (
        Interval(0, 0.0, 4.0, "rollout"),
        Interval(0, 4.0, 5.0, "switch"),
        Interval(1, 4.0, 5.0, "load"),
    )
    assert t.intervals[3] == Interval(0, 5.0, 8.0, "train", 1)
    assert len(t.intervals) == 10
    assert t.water_t_s == (0.0, 4.0, 6.0, 11.0)
    assert t.water_level == (3, 3, 1, 0)
    assert t.rollout_capacity == (4, 2, 2, 2)
    assert t.roles == (
        RoleChange(0.0, 0, "rollout"),
        RoleChange(0.0, 1, "rollout"),
        RoleChange(4.0, 0, "switching"),
        RoleChange(5.0, 0, "train"),
    )
    assert t.num_cells == 2


def test_reader_sees_flushed_records_and_ignores_a_torn_last_line(tmp_path: Path) -> None:
    w = TimelineWriter(tmp_path)
    w.interval(0, 0.0, 1.0, "rollout")
    assert read_timeline(tmp_path).intervals == (
        Interval(0, 0.0, 1.0, "rollout"),
    )  # writer still open
    w.close()
    path = tmp_path / TIMELINE_FILE
    with open(path, "ab") as f:
        f.write(b'{"type":"interval","cell":1,"start_s":1.0,"end_s":2.')  # killed mid-record
    assert read_timeline(tmp_path).intervals == (Interval(0, 0.0, 1.0, "rollout"),)
    with TimelineWriter(tmp_path) as w2:  # a resumed run: the torn fragment is cut off first
        w2.interval(1, 2.0, 3.0, "train", step=4)
    assert read_timeline(tmp_path).intervals == (
        Interval(0, 0.0, 1.0, "rollout"),
        Interval(1, 2.0, 3.0, "train", 4),
    )
    assert path.read_bytes().count(b"\n") == 2


def test_a_corrupt_complete_line_is_an_error_with_its_number(tmp_path: Path) -> None:
    with TimelineWriter(tmp_path) as w:
        w.water(0.0, 1, 2)
    with open(tmp_path / TIMELINE_FILE, "ab") as f:
        f.write(b'{"type":"nonsense"}\n')
    with pytest.raises(ValueError, match=r"timeline.jsonl:2: not a timeline record"):
        read_timeline(tmp_path)
    with pytest.raises(FileNotFoundError):
        read_timeline(tmp_path / "missing")


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda w: w.interval(0, 2.0, 1.0, "train"), "end_s=1.0 must be >= start_s=2.0"),
        (lambda w: w.interval(0, 0.0, 1.0, "nap"), "kind='nap'"),
        (lambda w: w.interval(-1, 0.0, 1.0, "train"), "cell=-1"),
        (lambda w: w.interval(0, math.nan, 1.0, "train"), "start_s=nan"),
        (lambda w: w.water(1.0, -2, 4), "level=-2"),
        (lambda w: w.role(1.0, 0, "resting"), "role='resting'"),
    ],
)
def test_bad_records_raise_and_write_nothing(tmp_path: Path, call, match: str) -> None:
    with TimelineWriter(tmp_path) as w:
        w.water(0.0, 0, 2)
        with pytest.raises(ValueError, match=match):
            call(w)
    t = read_timeline(tmp_path)
    assert (t.intervals, t.roles, t.water_level) == ((), (), (0,))


def test_utilisation_by_hand(tmp_path: Path) -> None:
    write_two_steps(tmp_path)
    t = read_timeline(tmp_path)
    u = utilisation(t, 2, 0.0, 14.0)
    # busy: cell 0 = rollout 4 + train 3 + step 2 + train 2 + step 2 = 13;
    # cell 1 = rollout [0, 11] = 11
    assert u.busy_cell_s == pytest.approx(24.0)
    assert u.busy == pytest.approx(24.0 / 28.0)
    assert u.cell_s_by_kind == pytest.approx(
        {"rollout": 15.0, "switch": 1.0, "train": 5.0, "step": 4.0, "load": 1.0, "idle": 3.0}
    )
    # level: 3*4 + 3*2 + 1*5 + 0*3 = 23; capacity: 4*4 + 2*10 = 36
    assert u.slot_fill == pytest.approx(23.0 / 36.0)
    # a window inside step 1: [4.5, 8.5]; cell 0 busy 5-8.5 = 3.5, cell 1 rollout 4.5-8.5 = 4
    w = utilisation(t, 2, 4.5, 8.5)
    assert w.busy_cell_s == pytest.approx(7.5) and w.busy == pytest.approx(7.5 / 8.0)
    assert w.cell_s_by_kind == pytest.approx(
        {"rollout": 4.0, "switch": 0.5, "train": 3.0, "step": 0.5, "load": 0.5}
    )
    # level 3*1.5 + 1*2.5 = 7; capacity 2*4 = 8
    assert w.slot_fill == pytest.approx(7.0 / 8.0)


def test_utilisation_per_step_by_hand(tmp_path: Path) -> None:
    write_two_steps(tmp_path)
    s1, s2 = utilisation_per_step(read_timeline(tmp_path), 2)
    assert (s1.step, s1.utilisation.start_s, s1.utilisation.end_s) == (1, 0.0, 10.0)
    # cell 0: 4 + 3 + 2 = 9, cell 1: rollout [0, 10] = 10 -> 19 / 20
    assert s1.utilisation.busy == pytest.approx(0.95)
    assert s1.utilisation.slot_fill == pytest.approx(22.0 / 28.0)  # (12 + 6 + 4) / (16 + 12)
    assert (s2.step, s2.utilisation.start_s, s2.utilisation.end_s) == (2, 10.0, 14.0)
    assert s2.utilisation.busy == pytest.approx(5.0 / 8.0)  # cell 0: 2 + 2, cell 1: rollout 10-11
    assert s2.utilisation.slot_fill == pytest.approx(1.0 / 8.0)
    assert s2.utilisation.cell_s_by_kind == pytest.approx(
        {"rollout": 1.0, "train": 2.0, "step": 2.0, "idle": 3.0}
    )


def test_untagged_steps_are_numbered_by_position(tmp_path: Path) -> None:
    write_two_steps(tmp_path, tags=(None, None))
    assert [s.step for s in utilisation_per_step(read_timeline(tmp_path), 2)] == [1, 2]
    write_two_steps(tmp_path / "resumed", tags=(7, 8))
    assert [s.step for s in utilisation_per_step(read_timeline(tmp_path / "resumed"), 2)] == [7, 8]


def test_utilisation_rejects_bad_windows() -> None:
    t = Timeline(
        intervals=(Interval(3, 0.0, 1.0, "train"),),
        water_t_s=(),
        water_level=(),
        rollout_capacity=(),
    )
    with pytest.raises(ValueError, match="cell 3 but num_cells=2"):
        utilisation(t, 2, 0.0, 1.0)
    with pytest.raises(ValueError, match="num_cells=0"):
        utilisation(t, 0, 0.0, 1.0)
    with pytest.raises(ValueError, match="start_s=2.0, end_s=1.0"):
        utilisation(t, 4, 2.0, 1.0)
    u = utilisation(t, 4, 0.0, 2.0)
    assert (u.busy, u.slot_fill) == (1.0 / 8.0, None)  # no water records: no slot fill


def test_the_simulator_uses_the_same_types() -> None:
    assert gyre.sim.Timeline is Timeline
    assert gyre.sim.engine.Interval is Interval
    assert not hasattr(gyre.sim, "plot_timeline")
