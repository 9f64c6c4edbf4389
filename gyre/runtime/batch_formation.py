"""Batch formation for the elastic driver: which finished groups make up each step's batch.

Owns `Group` (the `group_size` executions of one task in one step, their `TrainingBatch` once
all finished) and `BatchFormation` (the groups still being dispatched, the groups of the current
step's batch, those ready for training and not yet handed to a cell, and those finished for a
later step; a trained group is released with its step).
Streaming: a step's batch is the first `groups_per_batch` groups to finish, each trainable as
soon as it finishes; a group finishing after its step's batch is full carries over. Not streaming,
`unstreamed = "dispatched"` (the runtime's `scheduler.streaming = false`): step s trains groups
s*groups_per_batch .. (s+1)*groups_per_batch - 1, once all of them finished. Not streaming,
`"first_finished"` (AReaL's buffer; the simulator's Async baseline): the streaming batch, trainable
once it is full. Both drivers use it: the runtime (`gyre.runtime.elastic`) on `Group`s, the
simulator (`gyre.sim.engine`) on its own groups; only `.index` is read. Knows nothing about cells,
clocks or training; the driver moves groups.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, Literal, Protocol, TypeVar

from gyre.rollout.source import Executed
from gyre.runtime.batch import TrainingBatch
from gyre.tasks.task import Task

__all__ = ["BatchFormation", "Group"]


class Group:
    """The `size` executions of `task` dispatched as group `index` (in dispatch order)."""

    def __init__(self, index: int, task: Task, size: int) -> None:
        self.index = index
        self.task = task
        self.members: list[Executed | None] = [None] * size
        self.left = size
        """Members still running."""
        self.batch: TrainingBatch | None = None
        """The group's training batch, built once every member finished."""


class _Indexed(Protocol):
    @property
    def index(self) -> int: ...


GroupT = TypeVar("GroupT", bound=_Indexed)


class BatchFormation(Generic[GroupT]):
    """The groups of a run and how they form each step's batch (see the module docstring); a
    group is anything with an `index` (the runtime's `Group`, the simulator's own)."""

    def __init__(
        self,
        *,
        groups_per_batch: int,
        streaming: bool,
        unstreamed: Literal["dispatched", "first_finished"] = "dispatched",
    ) -> None:
        if groups_per_batch < 1:
            raise ValueError(f"{groups_per_batch=} must be >= 1")
        if unstreamed not in ("dispatched", "first_finished"):
            raise ValueError(f"{unstreamed=} must be 'dispatched' or 'first_finished'")
        self.groups_per_batch = groups_per_batch
        self.streaming = streaming
        self.by_dispatch = not streaming and unstreamed == "dispatched"
        """The batch is the groups dispatched for the step (else the first to finish)."""
        self.dispatching: dict[int, GroupT] = {}
        """Groups some of whose members are still to be dispatched, by index; the driver drops a
        group when its last member starts. From then on only its executions, this formation
        (queue, step, backlog) and the trainers' bookkeeping hold it, and the step that trained
        it lets go of it (`next_step`): memory is bounded by the work in flight."""
        self.queue: deque[GroupT] = deque()
        """Groups of the current step's batch ready for training and not handed to a cell."""
        self.backlog: deque[GroupT] = deque()
        """Finished groups waiting for a later step's batch."""
        self.step_groups: list[GroupT] = []
        """Groups admitted to the current step's batch (streaming) or waiting for it."""

    @property
    def full(self) -> bool:
        """The current step's batch has all its groups."""
        return len(self.step_groups) == self.groups_per_batch

    def complete(self, group: GroupT, steps_done: int) -> bool:
        """Take in `group`, all of whose members finished; True when this filled the batch."""
        if self.by_dispatch:
            self.backlog.append(group)
            return self._admit_whole_batch(steps_done)
        if len(self.step_groups) < self.groups_per_batch:
            return self._admit(group)
        self.backlog.append(group)
        return False

    def next_step(self, steps_done: int) -> bool:
        """Start the batch of the step after `steps_done` steps from the carried-over groups (the
        groups of the step done are released); True when that batch is already full."""
        self.step_groups = []
        if self.by_dispatch:
            return self._admit_whole_batch(steps_done)
        filled = False
        while self.backlog and len(self.step_groups) < self.groups_per_batch:
            filled = self._admit(self.backlog.popleft()) or filled
        return filled

    def _admit(self, group: GroupT) -> bool:
        """`group` joins the step's batch: trainable now when streaming, else (and by dispatch,
        where the batch is admitted whole) once the batch is full."""
        self.step_groups.append(group)
        if self.streaming:
            self.queue.append(group)
        elif self.full:
            self.queue.extend(self.step_groups)
        return self.full

    def _admit_whole_batch(self, steps_done: int) -> bool:
        """Not streaming: step s+1 trains groups s*gpb .. (s+1)*gpb - 1 once all finished."""
        if self.step_groups:
            return False
        first = steps_done * self.groups_per_batch
        wanted = set(range(first, first + self.groups_per_batch))
        ready = [g for g in self.backlog if g.index in wanted]
        filled = False
        if len(ready) == len(wanted):
            for g in ready:
                self.backlog.remove(g)
                filled = self._admit(g) or filled
        return filled
