"""Batch formation: which finished groups make each step's batch, streaming or not."""

from __future__ import annotations

import msgspec

from gyre.runtime.batch_formation import BatchFormation, Group
from gyre.tasks.task import Task, TaskSpec

TASK = Task(
    task_id="suite/t", root="/nonexistent", instruction="", spec=msgspec.convert({}, TaskSpec)
)


def groups(n: int) -> list[Group]:
    return [Group(i, TASK, 2) for i in range(n)]


def indices(gs) -> list[int]:
    return [g.index for g in gs]


def test_a_group_starts_with_every_member_running() -> None:
    g = groups(1)[0]
    assert (g.members, g.left, g.batch) == ([None, None], 2, None)


def test_streaming_takes_the_first_groups_to_finish_and_carries_the_rest_over() -> None:
    form = BatchFormation(groups_per_batch=2, streaming=True)
    g = groups(5)
    assert form.complete(g[3], 0) is False  # first to finish: trainable at once
    assert indices(form.queue) == [3]
    assert form.complete(g[1], 0) is True  # fills the batch
    assert form.full and indices(form.step_groups) == [3, 1]
    assert form.complete(g[0], 0) is False and form.complete(g[4], 0) is False
    assert indices(form.backlog) == [0, 4] and indices(form.queue) == [3, 1]
    form.queue.clear()  # the driver handed both to cells
    assert form.next_step(1) is True  # the carried-over groups fill step 2's batch
    assert indices(form.step_groups) == [0, 4] and indices(form.queue) == [0, 4]
    assert not form.backlog
    form.queue.clear()
    assert form.next_step(2) is False and form.step_groups == [] and not form.full


def test_not_streaming_waits_for_the_groups_dispatched_for_the_step() -> None:
    form = BatchFormation(groups_per_batch=2, streaming=False)
    g = groups(4)
    assert form.complete(g[2], 0) is False  # a group of step 2 finished first: it waits
    assert form.complete(g[0], 0) is False  # step 1 still lacks group 1
    assert not form.queue and indices(form.backlog) == [2, 0]
    assert form.complete(g[1], 0) is True
    assert indices(form.step_groups) == [0, 1] and indices(form.queue) == [0, 1]
    assert indices(form.backlog) == [2]
    form.queue.clear()
    assert form.complete(g[3], 0) is False  # step 1's batch is still in progress
    assert form.next_step(1) is True
    assert indices(form.step_groups) == [2, 3] and not form.backlog
