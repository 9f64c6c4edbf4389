"""The driver mechanics the node runtime and the cluster simulator share, written once.

Owns what the pure scheduler policies (`gyre.runtime.scheduler`) leave to a driver, apart from
batch formation (`gyre.runtime.batch_formation`): `least_loaded` (placement of an execution on a
rollout cell, with the capacity rule), `move_off` and `resume_suspended` (the executions of a cell
leaving rollout move to cells with room, or are suspended; the suspended resume first in, first
out, when room returns), `assign_training` (ready groups to idle training cells,
in queue order), `decide_until_idle` (call `policy.decide` and apply its actions through the
driver's callbacks until it returns none, checking each action against the snapshot it came
from; one stall rule, `MAX_DECISIONS`) and `Running` (the runtime's tasks in flight: with none
and a policy that starts nothing, the run is stalled; the simulator's rule is its empty event
queue). `gyre.runtime.elastic.ElasticRuntime` (real cells, wall
clock) and `gyre.sim.engine` (simulated cells, event queue) both call these functions on their own
cell objects. Knows nothing about clocks, engines, processes or what a group holds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence, Sized
from typing import Any, Protocol, TypeVar

from anyio.abc import TaskGroup

from gyre.cell.wire import CellRole
from gyre.errors import RunStalled
from gyre.runtime.scheduler import (
    Action,
    Dispatch,
    SchedulerPolicy,
    SchedulerState,
    StartStep,
    SwitchToRollout,
    SwitchToTrain,
)

__all__ = [
    "MAX_DECISIONS",
    "least_loaded",
    "move_off",
    "resume_suspended",
    "assign_training",
    "decide_until_idle",
    "Running",
]

MAX_DECISIONS = 1000
"""Decisions at one instant after which a policy that still acts is stalled (an error): every
shipped policy settles within a few decisions per change (one switch at a time)."""


class _Placeable(Protocol):  # read-only members: a cell's own fields may be narrower types
    @property
    def index(self) -> int: ...
    @property
    def role(self) -> CellRole: ...
    @property
    def executions(self) -> Sized: ...


class _Trainable(Protocol):
    @property
    def role(self) -> CellRole: ...
    @property
    def busy(self) -> bool: ...


P = TypeVar("P", bound=_Placeable)
T = TypeVar("T", bound=_Trainable)
G = TypeVar("G")
E = TypeVar("E")


def least_loaded(
    cells: Iterable[P], *, capacity: int | None, avoid: Collection[int] = ()
) -> P | None:
    """The rollout cell of `cells` (index not in `avoid`) with the fewest executions, the lowest
    index among equals; None when there is none, or when `capacity` is given and even that cell
    holds `capacity` executions or more (no rollout cell has room). `capacity=None` places beyond
    capacity (the runtime's survivors of a dead cell)."""
    best = None
    for c in cells:
        if c.role != "rollout" or c.index in avoid:
            continue
        if best is None or (len(c.executions), c.index) < (len(best.executions), best.index):
            best = c
    if best is None or (capacity is not None and len(best.executions) >= capacity):
        return None
    return best


def move_off(
    executions: Iterable[E],
    cells: Sequence[P],
    *,
    capacity: int,
    avoid: Collection[int],
    move: Callable[[E, P], None],
    suspend: Callable[[E], None],
) -> None:
    """The executions of a cell leaving rollout, in the order given: each goes to the least loaded
    rollout cell outside `avoid` (the leaving cells) with room, `move(execution, cell)`, which must
    add it to that cell's executions; when no such cell has room, `suspend(execution)` (partial
    rollouts: it resumes by `resume_suspended`)."""
    for execution in executions:
        cell = least_loaded(cells, capacity=capacity, avoid=avoid)
        if cell is None:
            suspend(execution)
        else:
            move(execution, cell)


def resume_suspended(
    suspended: deque[E], cells: Sequence[P], *, capacity: int, resume: Callable[[E, P], None]
) -> int:
    """Resume suspended executions, first suspended first, each on the least loaded rollout cell
    with room, while one has room: `resume(execution, cell)` must add it to that cell's
    executions. Returns how many resumed. A driver calls it before the policy decides, so the
    suspended resume before any new dispatch (`SchedulerState.free_slots`)."""
    resumed = 0
    while suspended:
        cell = least_loaded(cells, capacity=capacity)
        if cell is None:
            break
        resume(suspended.popleft(), cell)
        resumed += 1
    return resumed


def assign_training(
    cells: Iterable[T], queue: deque[G], *, step_running: bool, start: Callable[[T, G], None]
) -> None:
    """Hand the groups of `queue` (first in, first out) to the idle training cells of `cells`, in
    cell order, one group each: `start(cell, group)` must mark the cell busy. Nothing moves while
    the optimizer step runs (its batch is closed)."""
    if step_running:
        return
    for cell in cells:
        if not queue:
            return
        if cell.role == "train" and not cell.busy:
            start(cell, queue.popleft())
            assert cell.busy, "start() must mark the training cell busy"


def decide_until_idle(
    policy: SchedulerPolicy,
    *,
    prepare: Callable[[], None],
    state: Callable[[], SchedulerState],
    dispatch: Callable[[int], None],
    switch_to_train: Callable[[int, frozenset[int]], None],
    switch_to_rollout: Callable[[int], None],
    start_step: Callable[[], None],
    hold: Callable[[Sequence[Action]], Sequence[Action]] = lambda actions: actions,
    stalled: type[Exception] = RuntimeError,
    max_decisions: int = MAX_DECISIONS,
) -> int:
    """Call `policy.decide` until it returns no action; returns the decisions that acted.

    Each round: `prepare()` (training assignment, resumptions, anything the driver does without the
    policy), `state()` (the snapshot), the policy's actions less what `hold` keeps back, each
    applied in order: `dispatch(n)`, `switch_to_train(cell, leaving)` (`leaving`: every cell this
    decision moves out of rollout, so no execution is placed on one of them), `switch_to_rollout
    (cell)`, `start_step()`. Cells are positions in `SchedulerState.cells`.

    Raises:
        ValueError: an action the snapshot does not allow (a `Dispatch` beyond the free slots,
            a switch of a cell not in the role it leaves or of a busy trainer, a `StartStep`
            before the batch is trained).
        TypeError: an unknown action.
        stalled: the policy still acts after `max_decisions` decisions.
    """
    for decisions in range(max_decisions):
        prepare()
        snapshot = state()
        actions = hold(policy.decide(snapshot))
        if not actions:
            return decisions
        leaving = frozenset(a.cell for a in actions if isinstance(a, SwitchToTrain))
        for act in actions:
            _check(policy.name, act, snapshot)
            if isinstance(act, Dispatch):
                dispatch(act.n)
            elif isinstance(act, SwitchToTrain):
                switch_to_train(act.cell, leaving)
            elif isinstance(act, SwitchToRollout):
                switch_to_rollout(act.cell)
            else:
                start_step()
    raise stalled(f"{policy.name}: still acting after {max_decisions} decisions")


def _check(name: str, act: Any, state: SchedulerState) -> None:
    if isinstance(act, Dispatch):
        if act.n > state.free_slots:
            raise ValueError(f"{name}: Dispatch(n={act.n}) exceeds free slots {state.free_slots}")
    elif isinstance(act, SwitchToTrain | SwitchToRollout):
        if not 0 <= act.cell < len(state.cells):
            raise ValueError(f"{name}: {act!r} names no cell of {len(state.cells)}")
        cell = state.cells[act.cell]
        if isinstance(act, SwitchToTrain) and cell.role != "rollout":
            raise ValueError(f"{name}: SwitchToTrain({act.cell}) but the cell is {cell.role}")
        if isinstance(act, SwitchToRollout) and (cell.role != "train" or cell.busy):
            raise ValueError(
                f"{name}: SwitchToRollout({act.cell}) but the cell is {cell.role}, busy={cell.busy}"
            )
    elif isinstance(act, StartStep):
        if not state.step_ready:
            raise ValueError(f"{name}: StartStep before the batch is trained ({state.trained=})")
    else:
        raise TypeError(f"{name}: unknown action {act!r}")


class Running:
    """How many of a driver's tasks are in flight: executions, training, optimizer steps, role
    switches, evaluations, anything that may change what the policy sees. When none is and the
    policy starts nothing, nothing ever will: `check` raises instead of letting the run wait for
    ever (for example the `async` policy, which never changes a role, after its last rollout cell
    died with no execution on it). `ended` is called each time a task returns, after the count
    drops, so the driver checks again even when the task itself told nobody; a task that raises
    is not told (its error ends the driver's task group: a check then would add a second one)."""

    def __init__(self, ended: Callable[[], None]) -> None:
        self.tasks = 0
        self.ended = ended
        self.failed = False
        """A task raised (or was cancelled): the run is ending with its error, not stalled."""

    def start(self, tg: TaskGroup, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Start `fn(*args)` in task group `tg`, counted in `tasks` from now (not from when the
        task first runs) until it returns or raises."""
        tg.start_soon(self._run, fn, *args)
        self.tasks += 1  # after `start_soon`, which may raise; the task cannot run before this

    async def _run(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        try:
            await fn(*args)
        except BaseException:
            self.failed = True  # its error ends the driver's task group: no check after it
            raise
        finally:
            self.tasks -= 1
        self.ended()

    def check(self, policy: str, steps_done: int, steps: int, cells: Iterable[Any]) -> None:
        """Raise `RunStalled` if no task is in flight and none failed; call it after the policy
        decided. `cells`: objects with `name`, `role` and `alive`, named in the message."""
        if not self.tasks and not self.failed:
            roles = ", ".join(f"{c.name} {c.role if c.alive else 'dead'}" for c in cells)
            raise RunStalled(
                f"{policy}: nothing runs after {steps_done} of {steps} steps and the policy "
                f"starts nothing (cells: {roles})"
            )
