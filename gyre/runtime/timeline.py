"""Run timeline: what every cell did when, shared by the runtime, the simulator and the report.

Owns the in-memory records `Interval`, `RoleChange` and `Timeline`, the append-only file
`<run_dir>/timeline.jsonl` (`TimelineWriter`, `read_timeline`) and the utilisation measure
(`utilisation`, `utilisation_per_step`, `Utilisation`). Times are seconds since the run started
(the simulator: simulated seconds); whoever records passes them in. Knows nothing about cells,
engines, policies or how a run measured its times.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import msgspec

__all__ = [
    "BUSY_KINDS",
    "KINDS",
    "ROLES",
    "TIMELINE_FILE",
    "Interval",
    "RoleChange",
    "StepUtilisation",
    "Timeline",
    "TimelineWriter",
    "Utilisation",
    "read_timeline",
    "utilisation",
    "utilisation_per_step",
]

TIMELINE_FILE = "timeline.jsonl"

KINDS = ("rollout", "switch", "train", "load", "step", "idle")
"""Interval kinds: `rollout` (a rollout cell serving >= 1 request or hosting executions),
`switch` (changing role), `train` (computing micro-batches), `load` (loading weights), `step`
(the optimizer step) and `idle` (a training cell with nothing to do)."""

BUSY_KINDS = frozenset({"rollout", "train", "step"})
"""Kinds that count as useful work in `utilisation` (loads and switches are overhead)."""

ROLES = ("rollout", "train", "switching")
"""Roles a `RoleChange` may name (docs/design.md: a cell's role)."""


class Interval(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """What cell `cell` did from `start_s` to `end_s` (seconds); `kind` is one of `KINDS`.

    `step` tags the interval with the RL step it served (None when untagged).
    """

    cell: int
    start_s: float
    end_s: float
    kind: str
    step: int | None = None


class RoleChange(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Cell `cell` took role `role` (one of `ROLES`) at `t_s` seconds."""

    t_s: float
    cell: int
    role: str


class Timeline(msgspec.Struct, frozen=True, kw_only=True):
    """Per-cell activity, role changes and the water level over time, for plots and utilisation."""

    intervals: tuple[Interval, ...]
    water_t_s: tuple[float, ...]
    """Times at which the water level or the rollout capacity changed (non-decreasing)."""
    water_level: tuple[int, ...]
    """Unfinished executions (dispatched - finished) from `water_t_s[i]` on."""
    rollout_capacity: tuple[int, ...]
    """Execution slots of the cells in rollout from `water_t_s[i]` on."""
    roles: tuple[RoleChange, ...] = ()

    @property
    def num_cells(self) -> int:
        """1 + the largest cell index named by an interval or role change (0 if none)."""
        cells = [iv.cell for iv in self.intervals] + [r.cell for r in self.roles]
        return max(cells) + 1 if cells else 0


# --------------------------------------------------------------------------------------------
# the file


class _IntervalLine(msgspec.Struct, frozen=True, kw_only=True, tag="interval"):
    cell: int
    start_s: float
    end_s: float
    kind: str
    step: int | None = None


class _WaterLine(msgspec.Struct, frozen=True, kw_only=True, tag="water"):
    t_s: float
    level: int
    rollout_capacity: int


class _RoleLine(msgspec.Struct, frozen=True, kw_only=True, tag="role"):
    t_s: float
    cell: int
    role: str


_Line = _IntervalLine | _WaterLine | _RoleLine
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(_Line)


def _check_time(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name}={value!r} must be a finite number of seconds >= 0")


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}={value!r} must be an integer >= 0")


def _complete_length(path: Path, size: int, chunk: int = 1 << 16) -> int:
    """Bytes of `path` (of `size` bytes) up to and including its last newline."""
    with open(path, "rb") as f:
        end = size
        while end > 0:
            start = max(0, end - chunk)
            f.seek(start)
            i = f.read(end - start).rfind(b"\n")
            if i >= 0:
                return start + i + 1
            end = start
    return 0


class TimelineWriter:
    """Append-only writer of `<run_dir>/timeline.jsonl`: one JSON object per line.

    Each record is written with one `write` and flushed before the method returns, so a reader
    may read the file while it grows (it ignores a last line without its newline). Opening the
    file cuts off a torn last line left by a writer that was killed mid-record, so records
    appended after a resume start on a line of their own. Not thread-safe; call it from one
    thread. Bad arguments raise `ValueError` and write nothing.
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = Path(run_dir) / TIMELINE_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "ab")
        size = self._file.seek(0, os.SEEK_END)
        keep = _complete_length(self.path, size)
        if keep < size:
            self._file.truncate(keep)

    def _write(self, line: _Line) -> None:
        if self._file.closed:
            raise ValueError(f"{self.path}: the writer is closed")
        self._file.write(_encoder.encode(line) + b"\n")
        self._file.flush()

    def interval(
        self, cell: int, start_s: float, end_s: float, kind: str, step: int | None = None
    ) -> None:
        """Record that `cell` did `kind` (one of `KINDS`) from `start_s` to `end_s` (seconds)."""
        _check_count("cell", cell)
        _check_time("start_s", start_s)
        _check_time("end_s", end_s)
        if end_s < start_s:
            raise ValueError(f"end_s={end_s} must be >= start_s={start_s}")
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r} must be one of {KINDS}")
        if step is not None:
            _check_count("step", step)
        self._write(
            _IntervalLine(
                cell=cell, start_s=float(start_s), end_s=float(end_s), kind=kind, step=step
            )
        )

    def water(self, t_s: float, level: int, rollout_capacity: int) -> None:
        """Record the water level and the rollout capacity (execution slots) from `t_s` on."""
        _check_time("t_s", t_s)
        _check_count("level", level)
        _check_count("rollout_capacity", rollout_capacity)
        self._write(_WaterLine(t_s=float(t_s), level=level, rollout_capacity=rollout_capacity))

    def role(self, t_s: float, cell: int, role: str) -> None:
        """Record that `cell` took `role` (one of `ROLES`) at `t_s`."""
        _check_time("t_s", t_s)
        _check_count("cell", cell)
        if role not in ROLES:
            raise ValueError(f"role={role!r} must be one of {ROLES}")
        self._write(_RoleLine(t_s=float(t_s), cell=cell, role=role))

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> TimelineWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_timeline(run_dir: str | os.PathLike[str]) -> Timeline:
    """The `Timeline` recorded in `<run_dir>/timeline.jsonl`, records in file order.

    A last line without its newline (a record being written, or torn by a kill) is ignored.
    Raises `FileNotFoundError` when the file is missing and `ValueError` (with the line number)
    for a complete line that is not a timeline record.
    """
    path = Path(run_dir) / TIMELINE_FILE
    lines = path.read_bytes().split(b"\n")[:-1]  # the part after the last newline is incomplete
    intervals: list[Interval] = []
    roles: list[RoleChange] = []
    water_t: list[float] = []
    level: list[int] = []
    capacity: list[int] = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            rec = _decoder.decode(raw)
        except msgspec.DecodeError as exc:
            raise ValueError(f"{path}:{number}: not a timeline record: {exc}") from None
        if isinstance(rec, _IntervalLine):
            intervals.append(Interval(rec.cell, rec.start_s, rec.end_s, rec.kind, rec.step))
        elif isinstance(rec, _WaterLine):
            water_t.append(rec.t_s)
            level.append(rec.level)
            capacity.append(rec.rollout_capacity)
        else:
            roles.append(RoleChange(rec.t_s, rec.cell, rec.role))
    return Timeline(
        intervals=tuple(intervals),
        water_t_s=tuple(water_t),
        water_level=tuple(level),
        rollout_capacity=tuple(capacity),
        roles=tuple(roles),
    )


# --------------------------------------------------------------------------------------------
# utilisation


class Utilisation(msgspec.Struct, frozen=True, kw_only=True):
    """How busy `num_cells` cells were from `start_s` to `end_s` (see `utilisation`)."""

    start_s: float
    end_s: float
    num_cells: int
    busy_cell_s: float
    """Cell-seconds in which a cell was doing a kind of `BUSY_KINDS` (overlaps counted once)."""
    busy: float
    """busy_cell_s / (num_cells x (end_s - start_s)), in [0, 1]; NaN for an empty window."""
    cell_s_by_kind: dict[str, float]
    """Cell-seconds of each recorded kind in the window (each kind's overlaps counted once)."""
    slot_fill: float | None
    """Integral of the water level / integral of the rollout capacity over the window: the
    fraction of rollout execution slots that held an execution; None without water records or
    with no rollout capacity in the window."""


class StepUtilisation(msgspec.Struct, frozen=True, kw_only=True):
    """`Utilisation` of one RL step's window (see `utilisation_per_step`)."""

    step: int
    utilisation: Utilisation


def _union_length(spans: list[tuple[float, float]]) -> float:
    total = 0.0
    current: tuple[float, float] | None = None  # the merged span being extended
    for a, b in sorted(spans):
        if current is None or a > current[1]:
            if current is not None:
                total += current[1] - current[0]
            current = (a, b)
        else:
            current = (current[0], max(current[1], b))
    if current is not None:
        total += current[1] - current[0]
    return total


def _step_integral(
    t: tuple[float, ...], values: tuple[int, ...], start_s: float, end_s: float
) -> float:
    """Integral over [start_s, end_s] of the step function values[i] on [t[i], t[i + 1])."""
    total = 0.0
    for i, v in enumerate(values):
        a = max(t[i], start_s)
        b = min(t[i + 1] if i + 1 < len(t) else math.inf, end_s)
        if b > a:
            total += v * (b - a)
    return total


def utilisation(timeline: Timeline, num_cells: int, start_s: float, end_s: float) -> Utilisation:
    """Utilisation by slots of `num_cells` cells over the window [start_s, end_s] (seconds).

    Every interval is clipped to the window. For each cell, its busy time is the length of the
    union of its intervals of `BUSY_KINDS` (a rollout cell hosting >= 1 execution, a training
    cell computing, the core's optimizer step), so overlapping records count once; `busy` =
    sum over cells of busy time / (num_cells x (end_s - start_s)). It measures whether a cell
    held work, not how much CPU it burned. `slot_fill` = integral of `water_level` / integral
    of `rollout_capacity` over the window (both step functions, each value holding until the
    next record; before the first record they are taken as 0).

    Raises `ValueError` for num_cells < 1, end_s < start_s, a non-finite bound, or an interval
    on a cell >= num_cells.
    """
    if num_cells < 1:
        raise ValueError(f"num_cells={num_cells} must be >= 1")
    if not (math.isfinite(start_s) and math.isfinite(end_s)) or end_s < start_s:
        raise ValueError(f"start_s={start_s}, end_s={end_s}: need finite start_s <= end_s")
    busy: dict[int, list[tuple[float, float]]] = {}
    by_kind: dict[str, dict[int, list[tuple[float, float]]]] = {}
    for iv in timeline.intervals:
        if iv.cell >= num_cells:
            raise ValueError(f"an interval on cell {iv.cell} but num_cells={num_cells}")
        a, b = max(iv.start_s, start_s), min(iv.end_s, end_s)
        if b <= a:
            continue
        by_kind.setdefault(iv.kind, {}).setdefault(iv.cell, []).append((a, b))
        if iv.kind in BUSY_KINDS:
            busy.setdefault(iv.cell, []).append((a, b))
    busy_cell_s = sum(_union_length(spans) for spans in busy.values())
    wall = end_s - start_s
    cap = _step_integral(timeline.water_t_s, timeline.rollout_capacity, start_s, end_s)
    level = _step_integral(timeline.water_t_s, timeline.water_level, start_s, end_s)
    return Utilisation(
        start_s=start_s,
        end_s=end_s,
        num_cells=num_cells,
        busy_cell_s=busy_cell_s,
        busy=busy_cell_s / (num_cells * wall) if wall > 0 else math.nan,
        cell_s_by_kind={
            kind: sum(_union_length(spans) for spans in cells.values())
            for kind, cells in sorted(by_kind.items())
        },
        slot_fill=level / cap if cap > 0 else None,
    )


def utilisation_per_step(
    timeline: Timeline, num_cells: int, start_s: float = 0.0
) -> tuple[StepUtilisation, ...]:
    """`utilisation` of each RL step's window, in order of the steps' ends.

    Steps are the `step` intervals (optimizer steps). Step i's window runs from the end of
    step i-1's optimizer step (the first: from `start_s`) to the end of its own; its number is
    the interval's `step` tag, or its 1-based position when untagged. Raises as `utilisation`.
    """
    steps = sorted((iv for iv in timeline.intervals if iv.kind == "step"), key=lambda iv: iv.end_s)
    out = []
    prev = start_s
    for i, iv in enumerate(steps, start=1):
        out.append(
            StepUtilisation(
                step=iv.step if iv.step is not None else i,
                utilisation=utilisation(timeline, num_cells, prev, iv.end_s),
            )
        )
        prev = iv.end_s
    return tuple(out)
