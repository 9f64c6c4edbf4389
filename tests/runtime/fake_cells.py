"""A cell double for driver tests: a scripted engine for rollout and a ledger "trainer".

The trainer's "gradient" is the multiset of execution IDs whose micro-batches it trained, so a test
can check exactly what each optimizer step saw: satellites send their multiset to the core, the
core's `step` records it. Role rules mirror the real cell's (train only in `train`, no switch to
rollout with unsent gradients, no generation outside `rollout`).
"""

from __future__ import annotations

from collections import Counter

import anyio
import msgspec

from gyre.engines.scripted import ScriptedEngine
from gyre.errors import EngineUnavailableError
from gyre.rollout.source import Executed
from gyre.tasks.outcome import Outcome
from gyre.tito.records import ExecutionSummary


def failed_execution(execution_id: str, task_id: str, reason: str) -> Executed:
    """An execution that failed before any model call (nothing to train), as a rollout double
    returns it."""
    summary = ExecutionSummary(
        execution_id=execution_id,
        num_calls=0,
        truncated=False,
        length_calls=0,
        context_refusals=0,
        divergences=0,
        prompt_tokens=0,
        completion_tokens=0,
    )
    outcome = Outcome(
        execution_id=execution_id, task_id=task_id, termination="failed", failure_reason=reason
    )
    return Executed(outcome=outcome, calls=[], summary=summary)


class FakeStats(msgspec.Struct, frozen=True, kw_only=True):
    micro_batches: int
    counted: int
    logprob_abs_diff_sum: float = 0.0
    ratio_sum: float = 0.0
    same_version_abs_diff_sum: float = 0.0
    same_version_counted: int = 0


class FakeStep(msgspec.Struct, frozen=True, kw_only=True):
    version: int
    applied: bool
    grad_norm: float | None
    snapshot: str


class Exchange:
    """The run-wide "gradient group": one mailbox per (src, dst)."""

    def __init__(self) -> None:
        self.boxes: dict[tuple[int, int], tuple] = {}

    def box(self, src: int, dst: int):
        if (src, dst) not in self.boxes:
            self.boxes[(src, dst)] = anyio.create_memory_object_stream[Counter](1)
        return self.boxes[(src, dst)]


class FakeTrainingCell:
    def __init__(self, index: int, engine: ScriptedEngine, exchange: Exchange) -> None:
        self.index = index
        self.engine = engine
        self.exchange = exchange
        self.role = "rollout"
        self.grads: Counter = Counter()
        self.trainer_version = 0
        self.version = 0
        self.steps: list[Counter] = []
        self.switches: list[str] = []
        self.stale_trains = 0

    # the InferenceEngine protocol (rollout)
    def generate(self, request):
        if self.role != "rollout":
            raise EngineUnavailableError(f"cell {self.index} is {self.role}")
        return self.engine.generate(request)

    async def abort(self, request_id):
        return await self.engine.abort(request_id)

    async def load_weights(self, snapshot, version):
        await self.engine.load_weights(snapshot, version)

    async def pause(self):
        await self.engine.pause()

    async def resume(self):
        await self.engine.resume()

    def statistics(self):
        return self.engine.statistics()

    # the training API
    async def switch_role(self, role, snapshot=None, version=0):
        if role == "rollout" and self.grads:
            raise RuntimeError(f"cell {self.index}: switch to rollout with unsent gradients")
        if role == "train":
            await self.engine.pause()
            if snapshot is not None:
                self.trainer_version = version
        else:
            if snapshot is not None:
                await self.engine.load_weights(snapshot, version)
            await self.engine.resume()
        self.role = role
        self.switches.append(role)
        await anyio.sleep(0.01)
        return 0.01

    async def train(self, micro_batches, advantages):
        if self.role != "train":
            raise RuntimeError(f"cell {self.index}: train in role {self.role}")
        counted = 0
        for mb in micro_batches:
            for eid in mb.execution_ids:
                if advantages[eid] is not None:
                    self.grads[eid] += 1
            counted += int(mb.policy_T.sum())
        await anyio.sleep(0.02)
        return FakeStats(micro_batches=len(micro_batches), counted=counted)

    async def load_trainer_weights(self, snapshot, version):
        self.trainer_version = version

    async def send_gradients(self, dst):
        send, _ = self.exchange.box(self.index, dst)
        await send.send(self.grads)
        self.grads = Counter()

    async def receive_gradients(self, src):
        _, receive = self.exchange.box(src, self.index)
        self.grads += await receive.receive()

    async def step(self, snapshot_root):
        self.steps.append(self.grads)
        self.grads = Counter()
        self.version += 1
        self.trainer_version = self.version
        return FakeStep(
            version=self.version,
            applied=True,
            grad_norm=1.0,
            snapshot=f"{snapshot_root}/v{self.version}",
        )
