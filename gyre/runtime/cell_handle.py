"""The elastic driver's side of a cell: the handle it is given and what it tracks about each cell.

Owns `CellHandle` (a cell as the driver is given it: a name, its client, its process if any),
`DrivenCell` (the driver's bookkeeping for one cell: role, executions placed on it, busy flag,
the weight versions its trainer and engine hold, gradients and groups in its trainer, whether it
is alive, its current activity interval), and the death watch (`died`, `wait_cell_deaths`).
Knows nothing about HTTP, how policies decide, or batches beyond holding a cell's trained
`Group`s; the cell itself (a worker process) is `gyre.cell.server`, its client
`gyre.cell.client`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import anyio
import msgspec

from gyre.cell.client import CellClient, WatchedProcess
from gyre.cell.wire import CellRole
from gyre.runtime.scheduler import SwitchTarget
from gyre.runtime.timeline import TimelineWriter

if TYPE_CHECKING:
    from gyre.runtime.batch_formation import Group

__all__ = ["CellHandle", "DrivenCell", "died", "wait_cell_deaths"]


class CellHandle(msgspec.Struct, kw_only=True):
    """One cell as the driver is given it: a name, its client, and its process if it has one."""

    name: str
    client: CellClient
    """A `CellClient` (or, in tests, any object with its methods)."""
    process: WatchedProcess | None = None
    """Its process as the node watches it (`poll()`); None: never checked for death."""


class DrivenCell:
    """What the driver tracks about the cell `handle`, the `index`-th it was given (0: the core)."""

    def __init__(self, index: int, handle: CellHandle, version: int) -> None:
        self.index = index
        self.name = handle.name
        self.client = handle.client
        self.process = handle.process
        self.role: CellRole = "rollout"
        self.target: SwitchTarget | None = None
        """The role it switches to while `role == "switching"`."""
        self.executions: set[str] = set()
        self.busy = False
        self.trainer_version = version
        """Weight version in this cell's trainer."""
        self.engine_version = version
        """Weight version in this cell's inference engine."""
        self.has_grads = False
        self.trained_groups: list[Group] = []
        """Groups of the current step whose gradients sit in this cell's trainer."""
        self.lock = anyio.Lock()
        """One trainer operation at a time (a cell's trainer is not reentrant)."""
        self.alive = True
        self.kind = "idle"
        """The activity of the open timeline interval."""
        self.since = 0.0
        """Run seconds when that interval opened."""

    def begin_activity(
        self, kind: str, now: float, timeline: TimelineWriter | None, step: int
    ) -> None:
        """Close the open interval at `now` (written to `timeline`, when it has length) and open one
        of `kind`; nothing changes when the cell is already doing `kind`."""
        if kind == self.kind:
            return
        if timeline is not None and now > self.since:
            timeline.interval(self.index, self.since, now, self.kind, step=step)
        self.kind, self.since = kind, now

    def exit_code(self) -> int | None:
        """Its process's exit code; None while it runs or when it has no process."""
        return None if self.process is None else self.process.poll()


def died(cell: DrivenCell) -> bool:
    """Whether the cell's process (if it has one) has exited."""
    return cell.process is not None and cell.process.poll() is not None


async def confirm_death(cell: DrivenCell, within_s: float = 2.0) -> bool:
    """Whether the cell's process has exited, or exits within `within_s` seconds: a call that
    failed on a cell is its death only once the death is seen. A worker host's cells are seen
    dead when the head notices the worker's connection end, which can come after a call to one of
    them has already failed."""
    with anyio.move_on_after(within_s):
        while not died(cell):
            await anyio.sleep(0.05)
    return died(cell)


async def wait_cell_deaths(
    cells: Callable[[], Sequence[DrivenCell]], period_s: float
) -> list[DrivenCell]:
    """Check the processes of `cells()` every `period_s` seconds until some have exited; returns
    those cells (in `cells()` order). Cells without a process are never reported."""
    while True:
        await anyio.sleep(period_s)
        dead = [cell for cell in cells() if died(cell)]
        if dead:
            return dead
