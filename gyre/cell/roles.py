"""A cell's role and its trainer side: switching between rollout and train, and training.

Owns `CellRoles`: the cell's role (`rollout` at start, `switching`, `train`), its trainer
(`DeepSpeedTrainer`, optional) and gradient group (`GradientGroup`, optional), and the work behind
`/switch`, `/train`, `/load_trainer_weights`, `/send_gradients`, `/receive_gradients`, `/step`
and the checkpoints, with the counts `CellStatistics` reports. Nothing is rebuilt for a switch.
Torch work runs in a worker thread, one call at a time, never on the event loop. Knows nothing
about HTTP, the delta stream or process start-up; the engine and the generate requests in flight
are the serving side's (`gyre.cell.api`), handed in at construction.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from gyre.cell.wire import (
    CellRole,
    CheckpointRequest,
    LoadWeightsRequest,
    ReceiveGradientsRequest,
    SendGradientsRequest,
    StepRequest,
    StepResult,
    SwitchRequest,
    SwitchResult,
    TrainRequest,
)
from gyre.errors import EngineError, EngineTimeoutError, GyreError, InvalidRequestError

if TYPE_CHECKING:  # torch is imported only by a cell with a gradient group
    from gyre.cell.grad_group import GradientGroup

__all__ = ["CellRoles"]


class CellRoles:
    """One cell's role, trainer and gradient group; `engine()` returns the serving engine (or
    raises `EngineUnavailableError`), `inflight` holds the IDs of the generate requests being
    streamed, which a switch to train aborts."""

    def __init__(self, engine: Callable[[], object], inflight: Collection[str]) -> None:
        self._engine = engine
        self._inflight = inflight
        self.trainer = None  # CellTrainer (gyre.cell.ranks), with --trainer-config
        self.group: GradientGroup | None = None  # with --rank/--world-size/--group-store
        self.role: CellRole = "rollout"
        self._switch_lock = asyncio.Lock()
        self._torch_lock = asyncio.Lock()  # one trainer call at a time
        self.counts = dict(
            switches=0, requests_aborted_by_switch=0, micro_batches_trained=0, steps_applied=0
        )
        self.last_switch_s: float | None = None

    def _need_trainer(self):
        if self.trainer is None:
            raise InvalidRequestError("this cell has no trainer (start it with --trainer-config)")
        return self.trainer

    def _need_role(self, role: str, what: str) -> None:
        if self.role != role:
            raise InvalidRequestError(
                f"{what} needs role {role!r}; the cell is in role {self.role!r}"
            )

    def _need_group(self):
        if self.group is None:
            raise InvalidRequestError(
                "this cell has no gradient group "
                "(start it with --rank, --world-size and --group-store)"
            )
        return self.group

    async def _torch(self, fn, *args):
        """Run blocking trainer work in a worker thread, one call at a time; a `ValueError` from
        the trainer is the caller's bad input."""
        async with self._torch_lock:
            try:
                return await asyncio.to_thread(fn, *args)
            except GyreError:
                raise
            except (ValueError, FileNotFoundError) as exc:
                raise InvalidRequestError(str(exc)) from None

    async def switch(self, req: SwitchRequest) -> SwitchResult:
        if req.role not in ("rollout", "train"):
            raise InvalidRequestError(
                f"role {req.role!r} is unknown: expected 'rollout' or 'train'"
            )
        engine = self._engine()
        async with self._switch_lock:
            if req.role == self.role:
                return SwitchResult(seconds=0.0)
            start = time.perf_counter()
            if req.role == "train":
                await self._to_train(engine, req)
            else:
                await self._to_rollout(engine, req)
            self.last_switch_s = time.perf_counter() - start
            self.counts["switches"] += 1
            return SwitchResult(seconds=self.last_switch_s)

    async def _to_train(self, engine, req: SwitchRequest) -> None:
        trainer = self._need_trainer()
        self.role = "switching"  # new generate requests are refused from here on
        try:
            for request_id in list(
                self._inflight
            ):  # the router drained first; stragglers end as `abort`
                if await engine.abort(request_id):
                    self.counts["requests_aborted_by_switch"] += 1
            await engine.pause()
            if req.snapshot is not None:  # a satellite takes the core's weights
                await self._torch(trainer.load_weights, req.snapshot, req.version)
        except BaseException:
            await engine.resume()
            self.role = "rollout"
            raise
        self.role = "train"

    async def _to_rollout(self, engine, req: SwitchRequest) -> None:
        trainer = self._need_trainer()
        if trainer.has_gradients:
            raise InvalidRequestError(
                "switch to rollout refused: the trainer holds unsent gradients (send them, or step)"
            )
        self.role = "switching"
        try:
            await self._torch(trainer.zero_grad)  # frees the gradient memory
            if req.snapshot is not None and req.version != engine.statistics().weight_version:
                await engine.load_weights(req.snapshot, req.version)
            await engine.resume()
        except BaseException:
            self.role = "train"
            raise
        self.role = "rollout"

    async def train(self, req: TrainRequest):
        """Accumulate the micro-batches' gradients; the trainer's `AccumulateStatistics`."""
        trainer = self._need_trainer()
        self._need_role("train", "/train")
        stats = await self._torch(trainer.accumulate, req.micro_batches, req.advantages)
        self.counts["micro_batches_trained"] += stats.micro_batches
        return stats

    async def load_trainer_weights(self, req: LoadWeightsRequest) -> None:
        trainer = self._need_trainer()
        await self._torch(trainer.load_weights, req.snapshot, req.version)

    async def send_gradients(self, req: SendGradientsRequest) -> None:
        trainer = self._need_trainer()
        peer = _peer(self._need_group(), req.dst)
        self._need_role("train", "/send_gradients")

        # every rank of the cell sends its shard to the core's matching rank, then zeroes it (only
        # once delivered: a failed send keeps the gradients); `gyre.cell.ranks`
        await self._torch(
            _exchange, trainer.send_gradients, req.dst, f"send of gradients to {peer}"
        )

    async def receive_gradients(self, req: ReceiveGradientsRequest) -> None:
        trainer = self._need_trainer()
        peer = _peer(self._need_group(), req.src)
        self._need_role("train", "/receive_gradients")

        # every rank of the cell adds the matching rank of cell `src`'s shard to its own
        await self._torch(
            _exchange, trainer.receive_gradients, req.src, f"receive of gradients from {peer}"
        )

    async def step(self, req: StepRequest) -> StepResult:
        trainer = self._need_trainer()
        self._need_role("train", "/step")

        def step() -> StepResult:
            if not trainer.has_gradients:  # a step whose groups had nothing to learn from: no
                # update (DeepSpeed's ZeRO step without a backward raises IndexError)
                return StepResult(
                    version=trainer.version, applied=False, grad_norm=None, snapshot=None
                )
            stats = trainer.apply_step()
            snapshot = str(trainer.save_snapshot(req.snapshot_root)) if stats.applied else None
            return StepResult(
                version=stats.version,
                applied=stats.applied,
                grad_norm=stats.grad_norm,
                snapshot=snapshot,
            )

        result = await self._torch(step)
        self.counts["steps_applied"] += result.applied
        return result

    async def save_checkpoint(self, req: CheckpointRequest) -> None:
        await self._torch(self._need_trainer().save_checkpoint, req.path)

    async def load_checkpoint(self, req: CheckpointRequest) -> None:
        await self._torch(self._need_trainer().load_checkpoint, req.path)


def _peer(group, cell: int) -> str:
    """How an exchange names its peer cell: "rank R (cell C)", R the rank of cell C that this
    rank 0 exchanges with. `InvalidRequestError` for a cell outside the group."""
    try:
        return f"rank {group.rank_in(cell)} (cell {cell})"
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None


def _exchange(fn, cell: int, what: str):
    """Run a gradient send/receive with cell `cell`; gloo's errors (a peer that never came, or
    went) become `EngineTimeoutError` / `EngineError` naming the exchange."""
    try:
        return fn(cell)
    except RuntimeError as exc:
        text = str(exc)
        if (
            "timed out" in text.lower() or "timeout" in text.lower()
        ):  # gloo: "Timed out waiting 20000ms ..."
            raise EngineTimeoutError(f"{what} timed out: {text[:300]}") from None
        raise EngineError(f"{what} failed: {text[:300]}") from None
