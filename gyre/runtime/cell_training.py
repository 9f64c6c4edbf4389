"""The elastic driver's operations on its cells: switch a role, train one group, move a gradient.

Owns `switch_role` (a cell's side of a role change, with the router told), `train_group` (a
training cell takes one finished group's micro-batches, loading the published weights first when
its trainer is behind) and `send_gradients` (a satellite's accumulated gradient into the core's).
They hold the cells' trainer locks (a trainer is not reentrant) and update the driver's
`DrivenCell` bookkeeping; `load_published_weights` loads a step's weights on the rollout cells.
Knows nothing about scheduling, batch formation or steps: the driver (`gyre.runtime.elastic`)
decides which cell does what.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import anyio

from gyre.errors import WeightSyncError, grouped_errors
from gyre.routing.router import Router
from gyre.runtime.batch_formation import Group
from gyre.runtime.cell_handle import DrivenCell
from gyre.runtime.weight_version import WeightVersion

__all__ = ["switch_role", "load_published_weights", "train_group", "send_gradients"]

logger = logging.getLogger(__name__)


async def switch_role(
    cell: DrivenCell, role: str, *, core: DrivenCell, weights: WeightVersion, router: Router
) -> None:
    """Move `cell` to `role` ("train" or "rollout"). To train: `router` first stops routing to it
    (redirecting its in-flight requests), then the cell switches; a satellite's trainer loads the
    published `weights`. To roll out: a satellite first sends its accumulated gradient to `core`,
    the cell's engine loads `weights`, `router` routes to it again, and it loads any step
    published meanwhile. Raises the cell's `GyreError`s."""
    if role == "train":
        await router.set_role(cell.name, "train")  # redirects its in-flight requests
        async with cell.lock:
            satellite = cell is not core
            await cell.client.switch_role(
                "train", weights.snapshot if satellite else None, weights.version
            )
            if satellite:
                cell.trainer_version = weights.version
        return
    if cell is not core:
        await send_gradients(cell, core)
    async with cell.lock:
        version = weights.version
        await cell.client.switch_role("rollout", weights.snapshot, version)
        cell.engine_version = version
    if not cell.alive:  # dropped meanwhile: a step's weight load failed on it
        return
    router.mark_up(cell.name)  # it loaded: back in service if a failed load took it out (B17)
    router.note_weight_version(cell.name, version)
    await router.set_role(cell.name, "rollout")
    while weights.is_stale(cell.engine_version):  # a step was published meanwhile
        version = weights.version
        await cell.client.load_weights(weights.saved(), version)
        cell.engine_version = version
        router.note_weight_version(cell.name, version)


async def load_published_weights(
    router: Router, cells: Sequence[DrivenCell], weights: WeightVersion
) -> dict[str, str]:
    """Load the published `weights` on the router's rollout cells. A cell whose load fails is out of
    service (field case B17: its engine may hold half-loaded weights; the router unpinned its
    executions) and is tried once more on its own; a cell that loads then serves again, its
    executions pinned to it again. Sets `engine_version` of each of `cells` in rollout that
    loaded. Returns cell name -> why, for the cells whose load failed twice (still out of
    service). Raises `WeightSyncError` when it failed twice on every rollout cell."""
    first = await router.try_load_weights(weights.saved(), weights.version)
    failed = first
    if first:
        logger.warning(
            "weight load of version %d failed on %s: trying those cells once more",
            weights.version,
            first,
        )
        failed = await router.try_load_weights(weights.saved(), weights.version, first)
    rollout = [c for c in cells if c.role == "rollout"]
    if failed and all(c.name in failed for c in rollout):
        raise WeightSyncError(
            f"weight load of version {weights.version} failed twice on every rollout cell: "
            f"{dict(sorted(failed.items()))}"
        )
    for cell in rollout:
        if cell.name in first and cell.name not in failed:
            for execution_id in sorted(cell.executions):
                router.pin(execution_id, cell.name)
        if cell.name not in failed:
            cell.engine_version = weights.version
    return failed


async def train_group(
    cell: DrivenCell,
    group: Group,
    weights: WeightVersion,
    activity: Callable[[DrivenCell, str], None],
) -> list[Any]:
    """Train `group`'s batch on `cell` (a training cell), loading `weights` into its trainer
    first when it holds an older version (`activity(cell, "load" | "train")` marks the
    timeline). Returns the trainer's statistics (one record; none for a group with nothing to
    train). Raises what the cell's client raises (`GyreError`), with nothing recorded."""
    async with cell.lock:
        if weights.is_stale(cell.trainer_version):
            activity(cell, "load")
            await cell.client.load_trainer_weights(weights.saved(), weights.version)
            cell.trainer_version = weights.version
        activity(cell, "train")
        stats = []
        if group.batch is not None:
            stats.append(await cell.client.train(group.batch.micro_batches, group.batch.advantages))
            cell.has_grads = True
        cell.trained_groups.append(group)
        return stats


async def send_gradients(satellite: DrivenCell, core: DrivenCell) -> None:
    """Move `satellite`'s accumulated gradient into `core`'s (both trainers locked; nothing to
    do when it has none); the groups it trained go with it. Raises the first client's
    `GyreError` itself, not inside an ExceptionGroup (the runtime drops a dead satellite on it),
    with nothing moved."""
    async with satellite.lock, core.lock:
        if not satellite.has_grads:
            return
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(satellite.client.send_gradients, core.index)
                tg.start_soon(core.client.receive_gradients, satellite.index)
        except BaseExceptionGroup as group:
            if errors := grouped_errors(group):
                raise errors[0] from None
            raise
        satellite.has_grads = False
        core.has_grads = True
        core.trained_groups += satellite.trained_groups
        satellite.trained_groups = []
