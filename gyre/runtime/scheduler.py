"""Scheduler policies: which cell rolls out, which trains, how many executions to start.

Owns the policy seam the runtime's node loop and the cluster simulator (`gyre.sim`) both drive:
a frozen `SchedulerState` snapshot goes in, a tuple of frozen actions (`Dispatch`, `SwitchToTrain`,
`SwitchToRollout`, `StartStep`) comes out. Defines `SchedulerPolicy` (the Protocol) and the three
policies `ColocatePolicy`, `AsyncPolicy` and `ElasticPolicy`.

Policies are pure: no I/O, no clocks, no asyncio, no randomness; the same snapshot always gives
the same actions. They know nothing about engines, processes, HTTP or simulated time. The driver
(runtime or simulator) owns the mechanics: it places dispatched executions on rollout cells, moves
in-flight executions off a cell that leaves rollout (suspending those no rollout cell has room for,
and resuming them when room returns), hands ready micro-batches to idle training cells, forms
batches (streaming or not) and performs switches and optimizer steps; it calls `decide` again
after every change until a policy returns no action.
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

import msgspec

from gyre.cell.wire import CellRole

__all__ = [
    "CellRole",
    "SwitchTarget",
    "CellView",
    "SchedulerState",
    "Dispatch",
    "SwitchToTrain",
    "SwitchToRollout",
    "StartStep",
    "Action",
    "SchedulerPolicy",
    "ColocatePolicy",
    "AsyncPolicy",
    "ElasticPolicy",
    "admission_room",
    "make_policy",
]

SwitchTarget = Literal["rollout", "train"]
"""The role a switching cell is on its way to (a `CellRole` other than `switching`)."""

_ROLLOUT: CellRole = "rollout"


class CellView(msgspec.Struct, frozen=True, kw_only=True):
    """One cell as a policy sees it."""

    index: int
    """Position of the cell in `SchedulerState.cells` (0-based)."""
    role: CellRole
    is_core: bool = False
    """The training cell that holds the authoritative weights and optimizer state."""
    switching_to: SwitchTarget | None = None
    """Target role while `role == "switching"`, else None."""
    executions: int = 0
    """Executions in flight on this cell (only a rollout cell hosts executions)."""
    busy: bool = False
    """A training cell is computing a micro-batch, the optimizer step or loading weights."""

    def __post_init__(self) -> None:
        if self.index < 0:
            raise ValueError(f"index={self.index} must be >= 0")
        if self.executions < 0:
            raise ValueError(f"executions={self.executions} must be >= 0")
        if (self.role == "switching") != (self.switching_to is not None):
            raise ValueError(
                f"role={self.role!r} switching_to={self.switching_to!r}: a switching cell, "
                "and only "
                "a switching cell, names its target role"
            )
        if self.role != "rollout" and self.executions:
            raise ValueError(
                f"role={self.role!r} executions={self.executions}: "
                "only rollout cells host executions"
            )
        if self.role != "train" and self.busy:
            raise ValueError(f"role={self.role!r} busy=True: only training cells are busy")


class SchedulerState(msgspec.Struct, frozen=True, kw_only=True):
    """Frozen snapshot of everything a policy may look at.

    Counters are in executions. The water level (docs/design.md) is ``dispatched - finished``; the
    rollout capacity is ``capacity_per_cell`` times the number of cells whose role is `rollout`.
    "The current step" is step ``steps_done + 1``.
    """

    cells: tuple[CellView, ...]
    capacity_per_cell: int
    """Concurrent executions one rollout cell serves (bounded by its KV memory)."""
    batch_executions: int
    """Executions per optimizer step (the batch)."""
    dispatched: int
    """Executions started since the beginning of the run."""
    finished: int
    """Executions finished (completed, timed out or failed) since the beginning of the run."""
    suspended: int = 0
    """Unfinished executions on no cell: their cell left rollout and no rollout cell had room
    (partial rollouts). They count in the water level and resume, before any new dispatch, when
    rollout slots are free."""
    steps_done: int = 0
    """Optimizer steps completed. Not the published weight version (`WeightVersion`), which
    only a step that applies an update bumps."""
    train_ready: int = 0
    """Executions of the current step's batch ready for training and not yet handed to a cell."""
    train_running: int = 0
    """Micro-batches of the current step being computed now."""
    trained: int = 0
    """Executions of the current step whose gradients are in (step progress)."""
    step_running: bool = False
    """The optimizer step of the current step is in progress on the core cell."""

    def __post_init__(self) -> None:
        if not self.cells:
            raise ValueError("cells=() must not be empty")
        if self.capacity_per_cell <= 0:
            raise ValueError(f"capacity_per_cell={self.capacity_per_cell} must be > 0")
        if self.batch_executions <= 0:
            raise ValueError(f"batch_executions={self.batch_executions} must be > 0")
        if not 0 <= self.finished <= self.dispatched:
            raise ValueError(
                f"finished={self.finished} dispatched={self.dispatched}: "
                "need 0 <= finished <= dispatched"
            )
        cores = [c.index for c in self.cells if c.is_core]
        if len(cores) != 1:
            raise ValueError(f"core cells {cores}: exactly one cell must be the core")
        for i, c in enumerate(self.cells):
            if c.index != i:
                raise ValueError(f"cells[{i}].index={c.index} must equal its position")
            if c.executions > self.capacity_per_cell:
                raise ValueError(
                    f"cells[{i}].executions={c.executions} exceeds "
                    f"capacity_per_cell={self.capacity_per_cell}"
                )
        in_flight = sum(c.executions for c in self.cells)
        if in_flight + self.suspended != self.water_level:
            raise ValueError(
                f"executions on cells ({in_flight}) + {self.suspended=} != water level "
                f"({self.dispatched=} - {self.finished=})"
            )
        for name in ("suspended", "train_ready", "train_running", "trained", "steps_done"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")

    @property
    def water_level(self) -> int:
        """Unfinished executions, suspended ones included: ``dispatched - finished``."""
        return self.dispatched - self.finished

    @property
    def core(self) -> CellView:
        return next(c for c in self.cells if c.is_core)

    def with_role(self, role: CellRole) -> list[CellView]:
        return [c for c in self.cells if c.role == role]

    @property
    def rollout_capacity(self) -> int:
        """C_R: executions the current rollout cells can hold together."""
        return self.capacity_per_cell * sum(c.role == "rollout" for c in self.cells)

    @property
    def free_slots(self) -> int:
        """Room for new executions on the current rollout cells (suspended ones resume first)."""
        return self.rollout_capacity - self.water_level

    @property
    def any_switching(self) -> bool:
        return any(c.role == "switching" for c in self.cells)

    @property
    def idle_trainers(self) -> list[CellView]:
        return [c for c in self.cells if c.role == "train" and not c.busy]

    @property
    def step_ready(self) -> bool:
        """The whole batch is trained and the optimizer step can run on an idle core."""
        core = self.core
        return (
            self.trained >= self.batch_executions
            and self.train_running == 0
            and not self.step_running
            and core.role == "train"
            and not core.busy
        )


class Dispatch(msgspec.Struct, frozen=True, tag=True):
    """Start `n` new executions on rollout cells (the driver places them)."""

    n: int

    def __post_init__(self) -> None:
        if self.n <= 0:
            raise ValueError(f"n={self.n} must be > 0")


class SwitchToTrain(msgspec.Struct, frozen=True, tag=True):
    """Move `cell` rollout -> train; its in-flight executions move to other rollout cells."""

    cell: int


class SwitchToRollout(msgspec.Struct, frozen=True, tag=True):
    """Move the idle training cell `cell` train -> rollout (it loads the newest weights)."""

    cell: int


class StartStep(msgspec.Struct, frozen=True, tag=True):
    """Run the optimizer step of the current batch on the core cell; bumps the weight version."""


Action = Dispatch | SwitchToTrain | SwitchToRollout | StartStep


@runtime_checkable
class SchedulerPolicy(Protocol):
    """What the runtime and the simulator drive: initial roles, then `decide` after every change."""

    @property
    def name(self) -> str:
        """The policy's name (`colocate`, `async`, `elastic`, ...)."""
        ...

    def initial_roles(self, num_cells: int, core_cell: int) -> tuple[CellRole, ...]:
        """Roles at the start of the run (no switch cost is paid for them)."""
        ...

    def decide(self, state: SchedulerState) -> tuple[Action, ...]:
        """Actions to take now, applied in order; `()` when nothing should change."""
        ...


def admission_room(state: SchedulerState, max_staleness_steps: int) -> int:
    """Executions that may still start under the staleness bound.

    AReaL's admission rule (`max_head_offpolicyness`, see docs/notes/anchors.md §1a): an
    execution may start only while ``dispatched < (steps_done + 1 + k) * batch_executions``,
    so no execution starts more than ``k`` steps ahead of the step it is dispatched for (its
    batch, in the node runtime). Where batches are instead the first groups to finish (the
    simulator's ``unstreamed_batch = "first_finished"``), a straggler can be trained later than
    that: the per-token `RLConfig.max_staleness` mask (default 2) is then what bounds the trained
    staleness. ``k = 0`` is on-policy dispatch: the next batch starts only after the previous
    update.
    """
    bound = (state.steps_done + 1 + max_staleness_steps) * state.batch_executions
    return max(0, bound - state.dispatched)


def _check_staleness(k: int) -> None:
    if k < 0:
        raise ValueError(f"max_staleness_steps={k} must be >= 0")


class ColocatePolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Time-sharing (verl-style colocation): every cell rolls out the batch, then every cell trains.

    Rollout phase: dispatch into free slots under the staleness bound (`admission_room`); when the
    whole batch is ready for training, switch every cell to train at once. Train phase: the driver
    spreads micro-batches over all cells; `StartStep` when the batch is trained; after the update
    every cell switches back to rollout at once.

    With ``max_staleness_steps = 0`` (verl, on-policy) a step dispatches exactly its own batch and
    waits for its slowest execution. With k > 0 (partial rollouts, as in Kimi k1.5 and verl's
    partial rollout) slots freed by finished executions take executions of later steps; a driver
    that forms batches from the first groups to finish then switches with executions still
    running, suspends them (`SchedulerState.suspended`) through the training phase and resumes
    them in the next rollout phase, so stragglers carry over instead of holding every cell.
    """

    max_staleness_steps: int = 0
    """Versions an execution may start ahead of the step that trains it (0: on-policy). k > 0
    needs a driver that suspends executions: the simulator and the node runtime
    (`gyre.runtime.suspension`) both do."""
    name: str = "colocate"

    def __post_init__(self) -> None:
        _check_staleness(self.max_staleness_steps)

    def initial_roles(self, num_cells: int, core_cell: int) -> tuple[CellRole, ...]:
        return (_ROLLOUT,) * num_cells

    def decide(self, state: SchedulerState) -> tuple[Action, ...]:
        if state.step_ready:
            return (StartStep(),)
        if state.step_running or state.any_switching:
            return ()
        roles = {c.role for c in state.cells}
        batch_available = (
            state.train_ready + state.train_running + state.trained >= state.batch_executions
        )
        if roles == {"rollout"}:
            if batch_available:
                return tuple(SwitchToTrain(c.index) for c in state.cells)
            n = min(admission_room(state, self.max_staleness_steps), state.free_slots)
            return (Dispatch(n),) if n > 0 else ()
        if roles == {"train"}:
            # Nothing left to train and no whole batch: roll out. With k > 0 the groups carried
            # over from the last rollout phase may already be trained (`trained > 0`); their
            # gradients wait on the cells for the rest of the batch.
            idle = all(not c.busy for c in state.cells)
            if idle and state.train_running == 0 and not batch_available:
                return tuple(SwitchToRollout(c.index) for c in state.cells)
            return ()
        # Mixed roles only arise if the driver started from other roles: reunite on rollout.
        return tuple(SwitchToRollout(c.index) for c in state.idle_trainers if state.trained == 0)


class AsyncPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Fixed split with bounded staleness (AReaL / StreamRL-style disaggregation).

    `num_train_cells` cells (the core among them) train for the whole run, the others roll out;
    rollout cells start new executions whenever a slot is free and `admission_room` allows
    (staleness bound ``max_staleness_steps``). No role ever changes.
    """

    num_train_cells: int
    max_staleness_steps: int = 1
    name: str = "async"

    def __post_init__(self) -> None:
        if self.num_train_cells <= 0:
            raise ValueError(f"num_train_cells={self.num_train_cells} must be > 0")
        _check_staleness(self.max_staleness_steps)

    def initial_roles(self, num_cells: int, core_cell: int) -> tuple[CellRole, ...]:
        if self.num_train_cells >= num_cells:
            raise ValueError(
                f"num_train_cells={self.num_train_cells} must leave a rollout cell of {num_cells=}"
            )
        order = [core_cell] + [i for i in range(num_cells) if i != core_cell]
        train = set(order[: self.num_train_cells])
        return tuple("train" if i in train else "rollout" for i in range(num_cells))

    def decide(self, state: SchedulerState) -> tuple[Action, ...]:
        if state.step_ready:
            return (StartStep(),)
        n = min(admission_room(state, self.max_staleness_steps), state.free_slots)
        return (Dispatch(n),) if n > 0 else ()


class ElasticPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Water-level elastic cells (QwenGyre, docs/notes/anchors.md §0).

    Every cell starts in rollout. With w the water level, C_R the rollout capacity and C_e one
    cell's capacity:

    - rollout -> train: only when ``w <= C_R - C_e`` (the in-flight executions fit on the other
      rollout cells) and training data is waiting that no idle training cell can take; the core
      cell goes first, then the rollout cell with the fewest executions (least to migrate).
    - train -> rollout: an idle training cell with nothing to train returns when newly admitted
      executions need more room than the free slots; satellites first, the core last and only
      while the current step has no gradients accumulated on it.
    - one switch at a time: nothing switches while another cell is switching.
    - dispatch: new executions start into free slots under the staleness bound, but not while
      training data waits without a trainer (training first, so the water level can fall).
    - the core returns to training first (same water rule) whenever the current step has
      gradients on satellites, or micro-batches running there, while the core rolls out: only it
      can receive them and step (a driver that forced satellites into training gets here).

    When a role switch costs more than `max_switch_cost_s` (``switch_cost_s``, the round trip the
    driver expects, measured or configured), moving cells cannot pay off: the policy pins the
    fixed split of `fallback_train_cells` training cells and behaves as `AsyncPolicy` with it.
    """

    max_staleness_steps: int = 1
    """Same meaning and default as `AsyncPolicy`'s, so the two compare like for like."""
    switch_cost_s: float = 8.52 + 3.46
    """Expected rollout -> train plus train -> rollout seconds (QwenGyre's published switches)."""
    max_switch_cost_s: float = 3600.0
    """Above this round-trip cost the policy stops switching and pins its fallback split."""
    fallback_train_cells: int = 1
    """Training cells of the pinned split (used only when switching is too expensive)."""
    name: str = "elastic"

    def __post_init__(self) -> None:
        _check_staleness(self.max_staleness_steps)
        if not self.switch_cost_s >= 0:
            raise ValueError(f"switch_cost_s={self.switch_cost_s} must be >= 0")
        if self.fallback_train_cells <= 0:
            raise ValueError(f"fallback_train_cells={self.fallback_train_cells} must be > 0")

    @property
    def pinned(self) -> bool:
        """True when switching is too expensive and the policy keeps a fixed split."""
        return self.switch_cost_s > self.max_switch_cost_s

    def _fallback(self) -> AsyncPolicy:
        return AsyncPolicy(
            num_train_cells=self.fallback_train_cells, max_staleness_steps=self.max_staleness_steps
        )

    def initial_roles(self, num_cells: int, core_cell: int) -> tuple[CellRole, ...]:
        if self.pinned:
            return self._fallback().initial_roles(num_cells, core_cell)
        return (_ROLLOUT,) * num_cells

    def decide(self, state: SchedulerState) -> tuple[Action, ...]:
        if self.pinned:
            return self._fallback().decide(state)
        actions: list[Action] = []
        if state.step_ready:
            actions.append(StartStep())
        idle = [c for c in state.idle_trainers if not (c.is_core and state.step_ready)]
        waiting = state.train_ready > len(idle)
        core = state.core
        # gradients of the step exist or are being computed (on satellites) but the core, which
        # must receive them and step, is rolling out: it goes back first
        core_needed = core.role == "rollout" and (state.trained > 0 or state.train_running > 0)
        room = admission_room(state, self.max_staleness_steps)
        n = 0 if waiting or core_needed else min(room, state.free_slots)
        if n > 0:
            actions.append(Dispatch(n))
        if state.any_switching:
            return tuple(actions)
        water = state.water_level + n
        rollout = state.with_role("rollout")
        cap = state.capacity_per_cell
        fits = water <= (len(rollout) - 1) * cap  # its executions fit on the other rollout cells
        if core_needed and fits:
            actions.append(SwitchToTrain(core.index))
        elif waiting and rollout and fits:
            target = (
                core
                if core.role == "rollout"
                else min(rollout, key=lambda c: (c.executions, c.index))
            )
            actions.append(SwitchToTrain(target.index))
        elif room - n > 0 and state.train_ready == 0:
            core_may_leave = (
                state.trained == 0 and state.train_running == 0 and not state.step_running
            )
            candidates = [c for c in idle if not c.is_core or core_may_leave]
            if candidates:
                # Satellites before the core; among satellites the highest index first.
                target = max(candidates, key=lambda c: (not c.is_core, c.index))
                actions.append(SwitchToRollout(target.index))
        return tuple(actions)


def make_policy(
    name: str,
    *,
    max_staleness_steps: int = 1,
    async_train_cells: int = 1,
    switch_cost_s: float | None = None,
) -> SchedulerPolicy:
    """The policy called `name` (`colocate`, `async` or `elastic`) with the shared knobs
    (`max_staleness_steps` is the staleness bound of whichever policy is built).

    `switch_cost_s` (elastic only) is the expected rollout -> train -> rollout round trip; None
    keeps `ElasticPolicy`'s published default. Raises `ValueError` for an unknown name."""
    if name == "colocate":
        return ColocatePolicy(max_staleness_steps=max_staleness_steps)
    if name == "async":
        return AsyncPolicy(
            num_train_cells=async_train_cells, max_staleness_steps=max_staleness_steps
        )
    if name == "elastic":
        if switch_cost_s is None:  # the published default
            return ElasticPolicy(
                max_staleness_steps=max_staleness_steps, fallback_train_cells=async_train_cells
            )
        return ElasticPolicy(
            max_staleness_steps=max_staleness_steps,
            fallback_train_cells=async_train_cells,
            switch_cost_s=switch_cost_s,
        )
    raise ValueError(f"{name=} must be colocate, async or elastic")
