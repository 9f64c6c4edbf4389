"""Cell membership: the router's cells, their roles and health, session affinity and placement.

Owns `Membership` (the named cells in the order added, the execution -> cell pins, the held
(suspended) executions, `place`: the rollout cell for a choice's next attempt, its execution's
pinned cell or the least-loaded one, none while its execution is held, and weight loads on the
rollout cells, marking down those that fail), `CellMember` (one cell: engine,
role, health, attempts in flight) and its records (`CellRecord`, `MembershipStatistics`).

Knows nothing about requests beyond their affinity key, nor how attempts are driven or moved off a
cell (`gyre.routing.redirect`, `gyre.routing.router`).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import get_args

import anyio
import msgspec

from gyre.cell.wire import CellRole
from gyre.config import RouterConfig
from gyre.engines.protocol import EngineStatistics, InferenceEngine
from gyre.errors import EngineError, EngineUnavailableError, WeightSyncError
from gyre.routing.redirect import Choice, Leg, RequestState, Signal

__all__ = ["CellMember", "CellRecord", "Membership", "MembershipStatistics", "check_role"]

_ROLES: tuple[str, ...] = get_args(CellRole)


class CellRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One cell as the router sees it."""

    name: str
    role: CellRole
    down: str | None
    """Why the cell gets no requests (it died, refused, or a weight load failed); None: in
    service."""
    running: int
    """Attempts in flight on the cell."""
    executions: int
    """Executions pinned to the cell (session affinity); 0 unless it rolls out."""
    weight_version: int
    """Version last loaded through the router or noted after a role switch loaded it
    (`Router.note_weight_version`); when neither happened, the one reported when it was added."""


class MembershipStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What a `Membership` holds (docs/style.md rule 6); `RouterStatistics` documents each
    field."""

    weight_version: int
    max_model_len: int
    vocab_size: int
    cells_rollout: int
    cells_train: int
    cells_switching: int
    cells_down: int
    executions: int
    executions_held: int
    holds: int
    weight_loads_failed: int
    cells: tuple[CellRecord, ...]


class CellMember:
    """One cell as a member of the router: its engine, role, health, pinned executions and the
    attempts in flight on it (a `gyre.routing.redirect.Member`)."""

    def __init__(
        self,
        name: str,
        engine: InferenceEngine,
        role: CellRole,
        order: int,
        stats: EngineStatistics,
    ) -> None:
        self.name = name
        self.engine = engine
        self.role: CellRole = role
        self.order = order
        self.down: str | None = None
        self.retired = False
        """Its process is gone for good: down, and never offered a weight load again."""
        self.legs: set[Leg] = set()
        self.executions = 0
        self.weight_version = stats.weight_version
        self.max_model_len = stats.max_model_len
        self.vocab_size = stats.vocab_size
        self.legs_changed = Signal()

    @property
    def serving(self) -> bool:
        return self.role == "rollout" and self.down is None


class Membership:
    """The router's cells by name and the executions pinned to them.

    `cells` (name -> member, in the order added) and `pins` (execution -> member) are read by the
    router; change them only through the methods here. `changed` is notified whenever a cell joins,
    leaves, changes role or health, so that choices waiting in `place` look again.
    """

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.cells: dict[str, CellMember] = {}
        self.pins: dict[str, CellMember] = {}  # execution -> the member it is pinned to
        self.held: set[str] = set()  # suspended executions: their choices wait for a pin
        self.holds = 0  # times an execution was held, in all
        self.weight_loads_failed = 0  # a cell's weight load failed (it was marked down)
        self.changed = Signal()

    def add(self, name: str, engine: InferenceEngine, role: CellRole) -> None:
        """Add a cell (see `Router.add_cell`). Raises `ValueError` (duplicate name, unknown
        role)."""
        if name in self.cells:
            raise ValueError(f"cell {name!r} is already in the router")
        check_role(role)
        self.cells[name] = CellMember(name, engine, role, len(self.cells), engine.statistics())
        self.changed.notify()

    def remove(self, name: str) -> None:
        """Forget cell `name` (drained first by the router)."""
        del self.cells[name]
        self.changed.notify()

    def member(self, name: str) -> CellMember:
        """The member named `name`; `ValueError` if unknown."""
        cell = self.cells.get(name)
        if cell is None:
            raise ValueError(f"cell {name!r} is not in the router (cells: {sorted(self.cells)})")
        return cell

    def mark_down(self, cell: CellMember, reason: str) -> None:
        """Take `cell` out of service and unpin its executions."""
        cell.down = reason
        self.unpin_cell(cell)
        self.changed.notify()

    def mark_up(self, name: str) -> None:
        """Put cell `name` back into service. Raises `ValueError` for a retired cell."""
        cell = self.member(name)
        if cell.retired:
            raise ValueError(f"cell {name!r} is retired (its process died): add it again")
        cell.down = None
        self.changed.notify()

    def retire(self, name: str, reason: str) -> None:
        """Take cell `name` out of service for good (its process died): down, unpinned, and left
        out of every later weight load, so a dead cell cannot fail one (`Router.retire`)."""
        cell = self.member(name)
        cell.retired = True
        self.mark_down(cell, reason)

    def unpin_cell(self, cell: CellMember) -> None:
        """Unpin every execution pinned to `cell`."""
        for session in [s for s, c in self.pins.items() if c is cell]:
            del self.pins[session]
        cell.executions = 0

    def pin(self, execution_id: str, name: str) -> None:
        """Pin `execution_id` to cell `name` (see `Router.pin`); a held execution is released."""
        cell = self.member(name)
        old = self.pins.get(execution_id)
        if old is not None:
            old.executions -= 1
        self.pins[execution_id] = cell
        cell.executions += 1
        if execution_id in self.held:
            self.held.discard(execution_id)
            self.changed.notify()  # its waiting choices go to the cell

    def hold(self, execution_id: str) -> None:
        """Unpin `execution_id` and hold it: `place` gives its choices no cell until `pin`."""
        self.end_execution(execution_id)
        self.held.add(execution_id)
        self.holds += 1
        self.changed.notify()

    def end_execution(self, execution_id: str) -> None:
        """Forget the cell an execution is pinned to, or its hold (unknown IDs are ignored)."""
        self.held.discard(execution_id)
        cell = self.pins.pop(execution_id, None)
        if cell is not None:
            cell.executions -= 1

    async def place(
        self, state: RequestState, choice: Choice, avoid: CellMember | None
    ) -> CellMember | None:
        """A rollout member for the choice's next attempt (None once the caller aborted it); waits
        at most `no_cell_timeout_s` for one. While the choice's execution is held (`hold`) it waits
        for the execution's next pin with no bound of its own: the request's deadline
        (`request_timeout_s`) or its caller's abort ends that wait. Raises
        `EngineUnavailableError`."""
        if state.session in self.held:
            while state.session in self.held:
                if choice.user_aborted:
                    return None
                await self.changed.wait()
            if choice.moved_s is not None:  # its redirect latency counts from the resume
                choice.moved_s = anyio.current_time()
        with anyio.move_on_after(self.config.no_cell_timeout_s):
            while True:
                if choice.user_aborted:
                    return None
                if state.session in self.held:  # suspended while it waited for a cell
                    break
                cell = self._choose(state.session, avoid)
                if cell is not None:
                    return cell
                await self.changed.wait()
        if state.session in self.held:
            return await self.place(state, choice, avoid)
        roles = {
            c.name: c.role if c.down is None else f"{c.role}, down: {c.down}"
            for c in self.cells.values()
        }
        raise EngineUnavailableError(
            f"request {state.request.request_id!r}: no rollout cell in service for "
            f"no_cell_timeout_s={self.config.no_cell_timeout_s}; cells: {roles}"
        )

    def _choose(self, session: str, avoid: CellMember | None) -> CellMember | None:
        serving = [c for c in self.cells.values() if c.serving]
        if not serving:
            return None
        pinned = self.pins.get(session)
        if pinned is not None and pinned.serving and pinned is not avoid:
            return pinned
        pool = [c for c in serving if c is not avoid] or serving
        best = min(pool, key=lambda c: (len(c.legs), c.executions, c.order))
        if pinned is not None:
            pinned.executions -= 1
        self.pins[session] = best
        best.executions += 1
        return best

    async def load_weights(
        self, snapshot: str, version: int, names: Collection[str] | None = None
    ) -> tuple[int, dict[str, str]]:
        """Load `snapshot` as `version` on every `rollout` cell at once, or on those of them named
        in `names` (see `Router.load_weights`); returns how many cells were tried and cell name ->
        why, for each cell that failed (and is now marked down)."""
        failed: dict[str, str] = {}
        tried = 0

        async def load(cell: CellMember) -> None:
            try:
                await cell.engine.load_weights(snapshot, version)
            except (EngineError, WeightSyncError) as exc:
                failed[cell.name] = str(exc)
                self.weight_loads_failed += 1
                self.mark_down(cell, f"weight load of version {version} failed: {exc}")
                return
            cell.weight_version = version
            cell.down = None

        async with anyio.create_task_group() as tg:
            for cell in self.cells.values():
                wanted = names is None or cell.name in names
                if cell.role == "rollout" and not cell.retired and wanted:
                    tried += 1
                    tg.start_soon(load, cell)
        self.changed.notify()
        return tried, failed

    def statistics(self) -> MembershipStatistics:
        """A snapshot of every cell and of the pins."""
        cells = tuple(
            CellRecord(
                name=c.name,
                role=c.role,
                down=c.down,
                running=len(c.legs),
                executions=c.executions,
                weight_version=c.weight_version,
            )
            for c in self.cells.values()
        )
        serving = [c for c in self.cells.values() if c.serving]
        return MembershipStatistics(
            weight_version=min((c.weight_version for c in serving), default=0),
            max_model_len=min((c.max_model_len for c in self.cells.values()), default=0),
            vocab_size=min((c.vocab_size for c in self.cells.values()), default=0),
            cells_rollout=sum(c.role == "rollout" for c in cells),
            cells_train=sum(c.role == "train" for c in cells),
            cells_switching=sum(c.role == "switching" for c in cells),
            cells_down=sum(c.down is not None for c in cells),
            executions=len(self.pins),
            executions_held=len(self.held),
            holds=self.holds,
            weight_loads_failed=self.weight_loads_failed,
            cells=cells,
        )


def check_role(role: str) -> None:
    """Raise `ValueError` unless `role` is a `CellRole`."""
    if role not in _ROLES:
        raise ValueError(f"role={role!r} must be one of {_ROLES}")
