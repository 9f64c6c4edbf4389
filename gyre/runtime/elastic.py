"""The node runtime, for every cell count: cells move between rollout and training by a policy.

Owns `ElasticRuntime` (the driver); `gyre.runtime.elastic_job` starts cells and runs it, and
`gyre.runtime.step_ledger` keeps its run clock, step records, metrics and statistics. The driver
owns the mechanics the pure scheduler policies (`gyre.runtime.scheduler`) leave out, with the
simulator's own code for placement, training assignment and the decide loop
(`gyre.runtime.mechanics`) and batch formation: it places dispatched executions on rollout cells
(pinned in the `Router`), moves them off a cell that leaves rollout (the router redirects their
in-flight requests) or suspends those no cell has room for (`gyre.runtime.suspension`), hands a
finished group to an idle training cell, gathers the satellites' gradients on the core before its
optimizer step, publishes the new weights to the rollout cells, and calls `policy.decide` after
every change until no action is left.

Batches (docs/design.md "step"): executions are dispatched in order, `group_size` per task; which
finished groups form each step's batch (streaming or not, `SchedulerConfig.streaming`) is
`gyre.runtime.batch_formation`'s, each group trained as soon as it is admitted. Every execution's
loss weight uses the batch size as denominator (docs/design.md loss normalisation: per execution,
then over the batch's executions). The published weights are one `WeightVersion`, bumped by the
step.

Cells (`CellHandle`, tracked as `DrivenCell`s, `gyre.runtime.cell_handle`): anything with the
`CellClient` methods and, optionally, a process to watch. Cell 0 is the core. A cell whose
process dies (also mid-switch or mid-training) is dropped: its executions move to the survivors
(beyond their capacity; suspended if only a switch will bring one), groups its trainer held are
trained again; losing the core stops the run (`CellDiedError`). So is a cell whose engine fails
a weight load (a step's, after a second try; the core's stops the run, docs/design.md). A run
with nothing in flight and a policy that starts nothing stops with `RunStalled`, not waiting for
ever (the `async` policy after its only rollout cell died).

Held-out evaluations run on rollout cells; while one is due or running the driver holds the step
(`gyre.runtime.evaluation`). Trained groups are released when their step ends. One cell is the
colocate policy on it (the cell switches roles inside its process). `statistics()`: a frozen
`RuntimeStatistics`.

Role changes and activity go to the run's timeline. Knows nothing about HTTP, vLLM, DeepSpeed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from gyre.cell.wire import CellRole
from gyre.config import RunConfig
from gyre.errors import CellDiedError, GyreError, WeightSyncError
from gyre.rollout.source import RolloutSource
from gyre.rollout.tasks import pick_tasks
from gyre.routing.router import Router
from gyre.runtime.batch import group_batch
from gyre.runtime.batch_formation import BatchFormation, Group
from gyre.runtime.cell_handle import CellHandle, DrivenCell, confirm_death, wait_cell_deaths
from gyre.runtime.cell_training import (
    load_published_weights,
    send_gradients,
    switch_role,
    train_group,
)
from gyre.runtime.evaluation import HeldoutEvaluation, hold
from gyre.runtime.mechanics import Running, assign_training, decide_until_idle, least_loaded
from gyre.runtime.scheduler import CellView, SchedulerPolicy, SchedulerState
from gyre.runtime.step_ledger import (
    RuntimeStatistics,
    StepLedger,
    StepRecord,
    runtime_statistics,
    sink_statistics,
)
from gyre.runtime.suspension import Suspension
from gyre.runtime.weight_version import WeightVersion
from gyre.tasks.task import Task

__all__ = ["ElasticRuntime"]

logger = logging.getLogger(__name__)

_WATCH_S = 0.25
"""How often cell processes are checked for death."""


class ElasticRuntime:
    """Drive `policy` over `cells` until `steps` optimizer steps are done.

    Args:
        config: the run (scheduler, loop, trajectory and trainer settings).
        cells: the cells; `cells[0]` is the core. Their engines must already be in `router`.
        router: routes the executions' model calls to rollout cells.
        rollout: runs executions (proxy + harness); its limiter must admit every rollout slot.
        policy: a `SchedulerPolicy` (pure; see `gyre.runtime.scheduler`).
        tasks: the training tasks (the data stream is `pick_tasks` over them).
        heldout: the held-out tasks, evaluated as `config.loop` says (none: no evaluation).
        snapshot: the weights the cells start from (a Hugging Face folder), at `version`.
        timeline: a `TimelineWriter` (or None).
        metrics: a `MetricsWriter` (or None).
        progress: a `gyre.runtime.progress.Progress` shown each step and evaluation (or None).
        launch: part of every execution id (a restarted run never reuses one).
        journal: a `gyre.runtime.elastic_resume.RunJournal` (the ledger, a checkpoint after each
            step, the position of a resumed run), or None.
    """

    def __init__(
        self,
        *,
        config: RunConfig,
        cells: Sequence[CellHandle],
        router: Router,
        rollout: RolloutSource,
        policy: SchedulerPolicy,
        tasks: Sequence[Task],
        snapshot: str,
        version: int = 0,
        heldout: Sequence[Task] = (),
        timeline: Any = None,
        metrics: Any = None,
        progress: Any = None,
        launch: str = "0",
        journal: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        loop = config.loop
        if loop.batch_executions % loop.group_size:
            raise ValueError(
                f"loop.batch_executions={loop.batch_executions} must be a multiple of "
                f"loop.group_size={loop.group_size}"
            )
        if not cells:
            raise ValueError("cells=() must not be empty")
        if not tasks:
            raise ValueError("tasks=() must not be empty")
        self.config = config
        self.cells = [DrivenCell(i, c, version) for i, c in enumerate(cells)]
        self.router = router
        self.rollout = rollout
        self.policy = policy
        self.tasks = list(tasks)
        self.heldout = list(heldout)
        self.progress = progress
        self.weights = WeightVersion(version, snapshot)
        """The published weights: the step bumps them, switches and trainers read them."""
        self.timeline = timeline
        self.metrics = metrics
        self.launch = launch
        self.journal = journal
        self.B = loop.batch_executions
        self.G = loop.group_size
        self.capacity = config.scheduler.capacity_per_cell
        self.snapshot_root = Path(config.run_dir).resolve() / "snapshots"
        # counters the policy sees
        self.dispatched = 0
        self.finished = 0
        self.steps_done = 0
        self.trained = 0
        self.running = 0
        self.step_running = False
        self.batches = BatchFormation(
            groups_per_batch=self.B // self.G, streaming=config.scheduler.streaming
        )
        self.where: dict[str, DrivenCell] = {}  # a suspended execution: the cell it left
        self.suspension = Suspension(router)
        self.steps_target = loop.steps
        """The step `run` ends after (its argument)."""
        self.evaluation: HeldoutEvaluation | None = None
        self.eval_due: int | None = None
        """The step whose weights wait for their evaluation (it starts on a rollout cell)."""
        self.evaluating = False
        self.switch_s: list[float] = []
        self.switches_done = 0
        self.ledger = StepLedger(router, clock)
        """The run clock and each step's marks, records and metrics."""
        self._changed = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None
        self._running = Running(self._notify)  # tasks `_spawn` started, still in flight

    # -- the loop -------------------------------------------------------------------------------

    async def run(self, steps: int) -> list[StepRecord]:
        """Run until `steps` optimizer steps are done; returns one `StepRecord` per step.
        The held-out evaluations due run too, the last one after the last step.
        Executions still running then are cancelled (their agents are stopped)."""
        self.steps_target = steps
        self.evaluation = HeldoutEvaluation.of(self.config, self.heldout, steps, self.launch)
        self.ledger.start()
        if self.journal is not None:  # a resumed run's clock continues its timeline
            self.journal.continue_clock(self.ledger)
        for c in self.cells:
            c.since = self._now()
        async with anyio.create_task_group() as tg:
            self._tg = tg
            await self._initial_roles()
            if self.journal is not None:  # a resumed run: its groups, executions to run again
                await self.journal.begin(self)
            tg.start_soon(self._watch)
            if self.evaluation.due(self.steps_done):  # before the first (or resumed) step
                self.eval_due = self.steps_done
            while self.steps_done < steps or self.eval_due is not None or self.evaluating:
                self._decide()
                self._running.check(self.policy.name, self.steps_done, steps, self.cells)
                await self._changed.wait()
                self._changed = anyio.Event()
            tg.cancel_scope.cancel()
        now = self._now()
        for c in self.cells:
            self._activity(c, "idle", now)
        return self.ledger.records

    def _notify(self) -> None:
        self._changed.set()

    def _now(self) -> float:
        return self.ledger.now()

    def _live(self) -> list[DrivenCell]:
        return [c for c in self.cells if c.alive]

    @property
    def core(self) -> DrivenCell:
        return self.cells[0]

    def _state(self) -> SchedulerState:
        live = self._live()  # survivors of a lost cell may hold more than their capacity
        capacity = max([self.capacity, *(len(c.executions) for c in live)])
        views = tuple(
            CellView(
                index=i,
                role=c.role,
                is_core=c is self.core,
                switching_to=c.target,
                executions=len(c.executions),
                busy=c.busy and c.role == "train",
            )
            for i, c in enumerate(live)
        )
        return SchedulerState(
            cells=views,
            capacity_per_cell=capacity,
            batch_executions=self.B,
            dispatched=self.dispatched,
            finished=self.finished,
            weight_version=self.steps_done,
            train_ready=self.G * len(self.batches.queue),
            train_running=self.running,
            trained=self.trained,
            step_running=self.step_running,
            suspended=len(self.suspension.queue),
        )

    def _decide(self) -> None:
        live = self._live  # the policy numbers the live cells
        decide_until_idle(
            self.policy,
            prepare=self._prepare,
            state=self._state,
            hold=lambda actions: hold(
                actions,
                evaluation=self.eval_due is not None or self.evaluating,
                over=self.steps_done >= self.steps_target,
                rollout_cells=sum(c.role == "rollout" for c in live()),
            ),
            dispatch=self._dispatch,
            switch_to_train=lambda i, out: self._begin_switch(
                live()[i], "train", frozenset(live()[j].index for j in out)
            ),
            switch_to_rollout=lambda i: self._begin_switch(live()[i], "rollout"),
            start_step=self._start_step,
        )

    def _prepare(self) -> None:
        """What happens without the policy: suspended executions resume, ready groups go to idle
        trainers, a due evaluation starts."""
        self.suspension.resume(self._live(), capacity=self.capacity, pin=self._pin)
        assign_training(
            self._live(), self.batches.queue, step_running=self.step_running, start=self._train_on
        )
        self._start_evaluation()

    def _start_step(self) -> None:
        self.step_running = True
        self.core.busy = True
        self._spawn(self._step)

    def _spawn(self, fn, *args) -> None:
        assert self._tg is not None
        self._running.start(self._tg, fn, *args)

    # -- timeline -------------------------------------------------------------------------------

    def _activity(self, cell: DrivenCell, kind: str, now: float | None = None) -> None:
        """Close the cell's current interval and open one of `kind`."""
        now = self._now() if now is None else now
        cell.begin_activity(kind, now, self.timeline, self.steps_done + 1)

    def _rollout_activity(self, cell: DrivenCell) -> None:
        if cell.role == "rollout":
            busy = cell.executions or (self.evaluation and self.evaluation.load(cell))
            self._activity(cell, "rollout" if busy else "idle")

    def _water(self) -> None:
        if self.timeline is not None:
            live = self._live()
            self.timeline.water(
                self._now(),
                self.dispatched - self.finished,
                self.capacity * sum(c.role == "rollout" for c in live),
            )

    def _set_role(self, cell: DrivenCell, role: CellRole, target: CellRole | None = None) -> None:
        cell.role, cell.target = role, target
        if self.timeline is not None:
            self.timeline.role(self._now(), cell.index, role)
        self._water()

    # -- executions -----------------------------------------------------------------------------

    def _place(self) -> DrivenCell:
        """The least loaded live rollout cell with room, else the least loaded one (beyond its
        capacity: survivors of a lost cell may hold more). Raises `RuntimeError` with none."""
        live = self._live()
        cell = least_loaded(live, capacity=self.capacity) or least_loaded(live, capacity=None)
        if cell is None:
            raise RuntimeError(f"{self.policy.name}: no rollout cell to place an execution on")
        return cell

    def _pin(self, execution_id: str, cell: DrivenCell) -> None:
        self.router.pin(execution_id, cell.name)
        cell.executions.add(execution_id)
        self.where[execution_id] = cell
        self._rollout_activity(cell)

    def _dispatch(self, n: int) -> None:
        for _ in range(n):
            k = self.dispatched
            g, j = divmod(k, self.G)
            group = self.batches.dispatching.get(g)
            if group is None:
                task = pick_tasks(self.tasks, g, 1, self.config.seed)[0]
                group = self.batches.dispatching[g] = Group(g, task, self.G)
            if j == self.G - 1:  # its last member: the group lives on in its executions
                del self.batches.dispatching[g]
            execution_id = f"x{k}-{self.launch}-t{g}-g{j}"
            self._pin(execution_id, self._place())
            self.dispatched += 1
            self._spawn(self._execute, group, j, execution_id)
        self._water()

    async def _execute(self, group: Group, member: int, execution_id: str) -> None:
        executed = await self.rollout.run(group.task, execution_id)
        if self.journal is not None:  # in the ledger before its group can train
            self.journal.finished(self, group, member, executed)
        group.members[member] = executed
        group.left -= 1
        if group.left == 0:  # its batch first: the policy sees the finish and the group at once
            members = [m for m in group.members if m is not None]
            group.batch = await anyio.to_thread.run_sync(group_batch, members, self.config, self.B)
        cell = self.where.pop(execution_id)
        self.suspension.ended(execution_id)
        cell.executions.discard(execution_id)
        self.router.end_execution(execution_id)
        self._rollout_activity(cell)
        self.finished += 1
        self._water()
        if group.left == 0 and self.batches.complete(group, self.steps_done):
            self.ledger.mark_batch_in()
        self._notify()

    # -- training -------------------------------------------------------------------------------

    def _train_on(self, cell: DrivenCell, group: Group) -> None:
        cell.busy = True
        self.running += 1
        self._spawn(self._train, cell, group)

    async def _train(self, cell: DrivenCell, group: Group) -> None:
        try:
            trained = await train_group(cell, group, self.weights, self._activity)
        except GyreError as exc:
            if cell.alive and not await confirm_death(cell):
                raise
            logger.warning(
                "cell %s died while training group %d: it is trained again (%s)",
                cell.name,
                group.index,
                exc,
            )
            self.batches.queue.appendleft(group)
        else:
            self.ledger.train_stats.extend(trained)
            self.trained += self.G
            if self.batches.full and self.trained >= self.B:
                self.ledger.mark_trained()
        finally:
            self.running -= 1
            cell.busy = False
            if cell.alive:
                self._activity(cell, "idle")
            self._notify()

    async def _step(self) -> None:
        core = self.core
        for cell in self._live():
            if cell is not core and cell.has_grads:
                try:
                    await send_gradients(cell, self.core)
                except GyreError:
                    if not await confirm_death(cell):
                        raise
                    if cell.alive:
                        self._lose(cell)  # its groups go back to the queue: the step waits for them
                    self.step_running = core.busy = False
                    self._notify()
                    return
        t_step = self._now()
        async with core.lock:
            self._activity(core, "step")
            result = await core.client.step(str(self.snapshot_root))
            core.has_grads = False
            core.trained_groups = []
        if result.applied:
            weights = self.weights
            weights.publish(result.version, result.snapshot)
            core.trainer_version = weights.version
            failed = await load_published_weights(self.router, self._live(), weights)
            for cell in self._live():
                if cell.name in failed:
                    why = f"weight load of version {weights.version} failed twice"
                    self._drop_unloaded(cell, f"{why}: {failed[cell.name]}")
        self._activity(core, "idle")
        trained = [g.index for g in self.batches.step_groups]
        self._finish_step(result, t_step)
        if self.journal is not None:  # before the next step can start or train
            await self.journal.checkpoint(self, trained)
        self.step_running = core.busy = False
        self._notify()

    def _finish_step(self, result: Any, t_step: float) -> None:
        self.steps_done += 1
        record = self.ledger.close(
            step=self.steps_done,
            version=self.weights.version,
            groups=self.batches.step_groups,
            switches=self.switches_done,
            result=result,
            t_step=t_step,
            metrics=self.metrics,
            statistics=self._statistics,
        )
        r = record
        logger.info(
            "step %d: v%d, %.1f s, %d executions", r.step, r.version, r.step_s, r.executions
        )
        self.trained = 0
        if self.batches.next_step(self.steps_done):  # the step's groups are released here
            self.ledger.mark_batch_in()
        if self.progress is not None and self.ledger.last_metrics is not None:
            self.progress.step(self.ledger.last_metrics)
        if self.evaluation is not None and self.evaluation.due(self.steps_done):
            self.eval_due = self.steps_done  # its weights wait for their evaluation

    def _statistics(self) -> dict[str, Any]:
        return sink_statistics(
            router=self.router,
            rollout=self.rollout,
            weights=self.weights,
            runtime=self.statistics(),
        )

    def statistics(self) -> RuntimeStatistics:
        """What the runtime is doing now, as a frozen record (see `RuntimeStatistics`)."""
        return runtime_statistics(self)

    # -- held-out evaluation --------------------------------------------------------------------

    def _start_evaluation(self) -> None:
        """Start the due evaluation on the rollout cells; with none, bring a cell back for it."""
        if self.eval_due is None or self.evaluating or self.step_running:
            return
        if any(c.role == "rollout" for c in self._live()):
            step, self.eval_due = self.eval_due, None
            self.evaluating = True
            self._spawn(self._evaluate, step)
        elif cell := HeldoutEvaluation.recall(
            self.cells, core_may_leave=not (self.core.has_grads or self.trained)
        ):
            self._begin_switch(cell, "rollout")

    async def _evaluate(self, step: int) -> None:
        """Run the evaluation of `step` on the rollout cells (`HeldoutEvaluation.run`)."""
        assert self.evaluation is not None
        version = self.weights.version
        await self.evaluation.run(
            step,
            version=version,
            cells=self.cells,
            rollout=self.rollout,
            router=self.router,
            clock=self._now,
            on_change=self._rollout_activity,
            metrics=self.metrics,
            progress=self.progress,
        )
        assert self.weights.version == version, "a step published during an evaluation"
        self.evaluating = False
        self._notify()

    # -- role switches --------------------------------------------------------------------------

    def _begin_switch(
        self, cell: DrivenCell, role: CellRole, leaving: frozenset[int] = frozenset()
    ) -> None:
        """Start `cell`'s switch to `role`; one leaving rollout moves its executions to the least
        loaded rollout cells with room outside `leaving` (the cells this decision moves out of
        rollout), suspending those none has room for."""
        if cell.role == role or cell.role == "switching":
            raise RuntimeError(
                f"{self.policy.name}: switch of cell {cell.name} ({cell.role}) to {role}"
            )
        if role == "train":
            out = leaving | {cell.index}  # no execution lands on a cell leaving rollout
            self.suspension.move_off(cell, self._live(), self.capacity, out, self._pin)
            if self.evaluation is not None:
                self.evaluation.move_off(cell, self.cells, self.router)
        self._set_role(cell, "switching", role)
        self._spawn(self._switch, cell, role)

    async def _switch(self, cell: DrivenCell, role: CellRole) -> None:
        try:
            await self._switch_roles(cell, role)
        except GyreError as exc:
            if not cell.alive:  # dropped meanwhile (a step's weight load failed on it)
                return
            if await confirm_death(cell):  # died mid-switch: dropped like any dead cell
                self._lose(cell)
            elif isinstance(exc, WeightSyncError):
                self._drop_unloaded(cell, str(exc))
            else:
                raise

    async def _switch_roles(self, cell: DrivenCell, role: CellRole) -> None:
        t0 = self._now()
        self._activity(cell, "switch", t0)
        await switch_role(cell, role, core=self.core, weights=self.weights, router=self.router)
        if not cell.alive:
            return
        self.switch_s.append(self._now() - t0)
        self.switches_done += 1
        self._set_role(cell, role)
        self._activity(cell, "idle")
        self._rollout_activity(cell)
        self._notify()

    async def _initial_roles(self) -> None:
        roles = self.policy.initial_roles(len(self.cells), 0)
        async with anyio.create_task_group() as tg:
            for cell, role in zip(self.cells, roles, strict=True):
                if role == "train":
                    self._set_role(cell, "switching", "train")
                    tg.start_soon(self._switch, cell, "train")
        self.switch_s.clear()  # initial roles cost no switch (the policies' contract)
        self.switches_done = 0

    # -- cell deaths ----------------------------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            for cell in await wait_cell_deaths(self._live, _WATCH_S):
                self._lose(cell)

    def _drop_unloaded(self, cell: DrivenCell, why: str) -> None:
        """A cell whose engine failed to load the published weights (B17: it may hold half-loaded
        ones) is dropped like a dead cell; the run stops if it is the core or no other rolls out."""
        others = [c for c in self._live() if c is not cell and "rollout" in (c.role, c.target)]
        if cell is self.core or not others:
            who = "the core cell" if cell is self.core else "the last cell to roll out"
            raise WeightSyncError(f"{cell.name}, {who}: {why}")
        self._lose(cell, f"failed a weight load ({why})")

    def _lose(self, cell: DrivenCell, why: str | None = None) -> None:
        """Drop `cell` (`why`: what happened to it; None: its process exited)."""
        why = why or f"died (exit {cell.process.poll()})"
        if cell is self.core:
            raise CellDiedError(
                f"core cell {cell.name} {why}: its weights and optimizer state are lost"
            )
        logger.warning("cell %s %s: dropped; its executions move to the others", cell.name, why)
        cell.alive = False
        self.router.retire(cell.name, why)
        self._activity(cell, "idle")
        self.suspension.rehome(cell, self._live(), self._pin)
        if self.evaluation is not None:
            self.evaluation.move_off(cell, self.cells, self.router)
        for group in cell.trained_groups:  # its gradients died with it
            self.trained -= self.G
            self.batches.queue.appendleft(group)
        cell.trained_groups = []
        cell.has_grads = False
        self._water()
        self._notify()
