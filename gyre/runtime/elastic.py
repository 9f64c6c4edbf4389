"""The node runtime, for every cell count: cells move between rollout and training by a policy.

Owns `ElasticRuntime`, the driver. Its mutable run state is one `DriverState`
(`gyre.runtime.driver_state`); `gyre.runtime.elastic_job` starts cells and runs it,
`gyre.runtime.step_ledger` keeps its run clock, step records and `RuntimeStatistics`. The
policies (`gyre.runtime.scheduler`) are pure; the driver owns what they leave out, with the
simulator's own placement, training assignment and decide loop (`gyre.runtime.mechanics`): it
places dispatched executions on rollout cells (pinned in the `Router`), moves them off a cell
that leaves rollout or suspends them (`gyre.runtime.suspension`), hands each finished group of the
step's batch (`gyre.runtime.batch_formation`) to an idle training cell, and runs the step
(`_step`: gather the satellites' gradients on the core, optimizer step, publish the new
`WeightVersion` to the cells, record, checkpoint), calling `policy.decide` after every change.

Batches (docs/design.md "step"): `group_size` executions per task, dispatched in order; every
execution's loss weight uses the batch size as denominator (docs/design.md loss normalisation).

Cells (`CellHandle`, tracked as `DrivenCell`s): cell 0 is the core. A cell whose process dies,
or whose engine fails a weight load twice, is dropped: its executions move to the survivors,
groups its trainer held are trained again; losing the core stops the run (`CellDiedError`,
`WeightSyncError`). A run with nothing in flight and a policy that starts nothing stops with
`RunStalled`. Held-out evaluations run on rollout cells and hold the step
(`gyre.runtime.evaluation`). Role changes and activity go to the run's timeline. Knows nothing
about HTTP, vLLM, DeepSpeed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from gyre.cell.wire import CellRole, StepResult
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
from gyre.runtime.driver_state import DriverState
from gyre.runtime.elastic_resume import RunJournal
from gyre.runtime.evaluation import HeldoutEvaluation, hold
from gyre.runtime.mechanics import Running, assign_training, decide_until_idle, least_loaded
from gyre.runtime.metrics import MetricsWriter
from gyre.runtime.progress import Progress
from gyre.runtime.scheduler import SchedulerPolicy, SchedulerState, SwitchTarget
from gyre.runtime.step_ledger import (
    RuntimeStatistics,
    StepLedger,
    StepRecord,
    runtime_statistics,
    sink_statistics,
)
from gyre.runtime.suspension import Suspension
from gyre.runtime.timeline import TimelineWriter
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
        timeline: where role changes, activity and the water level go (or None).
        metrics: where each step's and evaluation's metrics go (or None).
        progress: shows each step and evaluation (or None).
        launch: part of every execution id (a restarted run never reuses one).
        journal: the ledger, a checkpoint per step, a resumed run's position (or None).

    The run's mutable state is one `DriverState` (`state`); `B`, `G`, `capacity` and
    `snapshot_root` are configuration, read-only."""

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
        timeline: TimelineWriter | None = None,
        metrics: MetricsWriter | None = None,
        progress: Progress | None = None,
        launch: str = "0",
        journal: RunJournal | None = None,
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
        self.router = router
        self.rollout = rollout
        self.policy = policy
        self.tasks = list(tasks)
        self.heldout = list(heldout)
        self.progress = progress
        self.timeline = timeline
        self.metrics = metrics
        self.launch = launch
        self.journal = journal
        self.B = loop.batch_executions
        self.G = loop.group_size
        self.capacity = config.scheduler.capacity_per_cell
        self.snapshot_root = Path(config.run_dir).resolve() / "snapshots"
        self.state = DriverState(
            cells=[DrivenCell(i, c, version) for i, c in enumerate(cells)],
            weights=WeightVersion(version, snapshot),
            batches=BatchFormation(
                groups_per_batch=self.B // self.G, streaming=config.scheduler.streaming
            ),
            suspension=Suspension(router),
            steps_target=loop.steps,
        )
        """Everything the run changes (`DriverState`)."""
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
        s = self.state
        s.steps_target = steps
        s.evaluation = HeldoutEvaluation.of(self.config, self.heldout, steps, self.launch)
        self.ledger.start()
        if self.journal is not None:  # a resumed run's clock continues its timeline
            self.journal.continue_clock(self.ledger)
        for c in s.cells:
            c.since = self._now()
        async with anyio.create_task_group() as tg:
            self._tg = tg
            await self._initial_roles()
            if self.journal is not None:  # a resumed run: its groups, executions to run again
                j = self.journal
                if await j.begin(s, tasks=self.tasks, ledger=self.ledger, rerun=self.rerun):
                    self._water()
            tg.start_soon(self._watch)
            if s.evaluation.due(s.steps_done):  # before the first (or resumed) step
                s.eval_due = s.steps_done
            while s.steps_done < steps or s.eval_due is not None or s.evaluating:
                self._decide()
                self._running.check(self.policy.name, s.steps_done, steps, s.cells)
                await self._changed.wait()
                self._changed = anyio.Event()
            tg.cancel_scope.cancel()
        now = self._now()
        for c in s.cells:
            self._activity(c, "idle", now)
        return self.ledger.records

    def rerun(self, group: Group, member: int, execution_id: str) -> None:
        """Run member `member` of `group` again as `execution_id` (a resumed run's, unfinished):
        placed and started, already counted as dispatched (`RunJournal.begin`)."""
        self._pin(execution_id, self._place())
        self._spawn(self._execute, group, member, execution_id)

    def _notify(self) -> None:
        self._changed.set()

    def _now(self) -> float:
        return self.ledger.now()

    def _spawn(self, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        assert self._tg is not None
        self._running.start(self._tg, fn, *args)

    def _scheduler_state(self) -> SchedulerState:
        return self.state.scheduler_state(
            capacity=self.capacity, batch_executions=self.B, group_size=self.G
        )

    def _decide(self) -> None:
        s = self.state
        live = s.live  # the policy numbers the live cells
        decide_until_idle(
            self.policy,
            prepare=self._prepare,
            state=self._scheduler_state,
            hold=lambda actions: hold(
                actions,
                evaluation=s.eval_due is not None or s.evaluating,
                over=s.steps_done >= s.steps_target,
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
        s = self.state
        s.suspension.resume(s.live(), capacity=self.capacity, pin=self._pin)
        assign_training(
            s.live(), s.batches.queue, step_running=s.step_running, start=self._train_on
        )
        self._start_evaluation()

    def _start_step(self) -> None:
        self.state.step_running = self.state.core.busy = True
        self._spawn(self._step)

    # -- timeline -------------------------------------------------------------------------------

    def _activity(self, cell: DrivenCell, kind: str, now: float | None = None) -> None:
        """Close the cell's current interval and open one of `kind`."""
        now = self._now() if now is None else now
        cell.begin_activity(kind, now, self.timeline, self.state.steps_done + 1)

    def _rollout_activity(self, cell: DrivenCell) -> None:
        if cell.role == "rollout":
            evaluation = self.state.evaluation
            busy = cell.executions or (evaluation is not None and evaluation.load(cell))
            self._activity(cell, "rollout" if busy else "idle")

    def _water(self) -> None:
        if self.timeline is not None:
            s = self.state
            self.timeline.water(
                self._now(),
                s.water_level,
                self.capacity * sum(c.role == "rollout" for c in s.live()),
            )

    def _set_role(
        self, cell: DrivenCell, role: CellRole, target: SwitchTarget | None = None
    ) -> None:
        cell.role, cell.target = role, target
        if self.timeline is not None:
            self.timeline.role(self._now(), cell.index, role)
        self._water()

    # -- executions -----------------------------------------------------------------------------

    def _place(self) -> DrivenCell:
        """The least loaded live rollout cell with room, else the least loaded one (beyond its
        capacity: survivors of a lost cell may hold more). Raises `RuntimeError` with none."""
        live = self.state.live()
        cell = least_loaded(live, capacity=self.capacity) or least_loaded(live, capacity=None)
        if cell is None:
            raise RuntimeError(f"{self.policy.name}: no rollout cell to place an execution on")
        return cell

    def _pin(self, execution_id: str, cell: DrivenCell) -> None:
        self.router.pin(execution_id, cell.name)
        cell.executions.add(execution_id)
        self.state.where[execution_id] = cell
        self._rollout_activity(cell)

    def _dispatch(self, n: int) -> None:
        s = self.state
        for _ in range(n):
            k = s.dispatched
            g, j = divmod(k, self.G)
            group = s.batches.dispatching.get(g)
            if group is None:
                task = pick_tasks(self.tasks, g, 1, self.config.seed)[0]
                group = s.batches.dispatching[g] = Group(g, task, self.G)
            if j == self.G - 1:  # its last member: the group lives on in its executions
                del s.batches.dispatching[g]
            execution_id = f"x{k}-{self.launch}-t{g}-g{j}"
            self._pin(execution_id, self._place())
            s.dispatched += 1
            self._spawn(self._execute, group, j, execution_id)
        self._water()

    async def _execute(self, group: Group, member: int, execution_id: str) -> None:
        s = self.state
        executed = await self.rollout.run(group.task, execution_id)
        if self.journal is not None:  # in the ledger before its group can train
            self.journal.finished(s.steps_done + 1, group, member, executed)
        group.members[member] = executed
        group.left -= 1
        if group.left == 0:  # its batch first: the policy sees the finish and the group at once
            members = [m for m in group.members if m is not None]
            group.batch = await anyio.to_thread.run_sync(group_batch, members, self.config, self.B)
        cell = s.where.pop(execution_id)
        s.suspension.ended(execution_id)
        cell.executions.discard(execution_id)
        self.router.end_execution(execution_id)
        self._rollout_activity(cell)
        s.finished += 1
        self._water()
        if group.left == 0 and s.batches.complete(group, s.steps_done):
            self.ledger.mark_batch_in()
        self._notify()

    # -- training -------------------------------------------------------------------------------

    def _train_on(self, cell: DrivenCell, group: Group) -> None:
        cell.busy = True
        self.state.running += 1
        self._spawn(self._train, cell, group)

    async def _train(self, cell: DrivenCell, group: Group) -> None:
        s = self.state
        try:
            trained = await train_group(cell, group, s.weights, self._activity)
        except GyreError as exc:
            if cell.alive and not await confirm_death(cell):
                raise
            logger.warning(
                "cell %s died while training group %d: it is trained again (%s)",
                cell.name,
                group.index,
                exc,
            )
            s.batches.queue.appendleft(group)
        else:
            self.ledger.train_stats.extend(trained)
            s.trained += self.G
            if s.batches.full and s.trained >= self.B:
                self.ledger.mark_trained()
        finally:
            s.running -= 1
            cell.busy = False
            if cell.alive:
                self._activity(cell, "idle")
            self._notify()

    # -- the step -------------------------------------------------------------------------------

    async def _step(self) -> None:
        """One optimizer step, started by the policy once the batch is trained: before it,
        executions ran (`_dispatch`, `_execute`) and their groups trained (`_train`)."""
        s = self.state
        core = s.core
        # 1. Gather: every satellite holding gradients sends them to the core. A satellite
        #    that died meanwhile is dropped; its groups go back to the queue and the step waits.
        if not await self._gather_gradients():
            s.step_running = core.busy = False
            self._notify()
            return
        # 2. Optimizer step on the core, which writes the new weights as a snapshot.
        t_step = self._now()
        async with core.lock:
            self._activity(core, "step")
            result = await core.client.step(str(self.snapshot_root))
            core.has_grads = False
            core.trained_groups = []
        # 3. Publish: bump the weight version and load it into every live cell's engine (a
        #    cell that fails the load twice is dropped).
        if result.applied:
            await self._publish(result)
        self._activity(core, "idle")
        # 4. Record: its `StepRecord` and metrics line; its groups are released.
        trained = [g.index for g in s.batches.step_groups]
        self._close_step(result, t_step)
        # 5. Evaluate: the new weights may be due for a held-out evaluation (the step waits).
        if s.evaluation is not None and s.evaluation.due(s.steps_done):
            s.eval_due = s.steps_done
        # 6. Checkpoint (with a journal), before the next step can start or train.
        if self.journal is not None:
            await self.journal.checkpoint(s, trained)
        # 7. Done: the core is free and the policy decides what comes next.
        s.step_running = core.busy = False
        self._notify()

    async def _gather_gradients(self) -> bool:
        """Send every live satellite's gradients to the core; False when one died meanwhile (it
        is dropped and its groups are queued to be trained again)."""
        core = self.state.core
        for cell in self.state.live():
            if cell is not core and cell.has_grads:
                try:
                    await send_gradients(cell, core)
                except GyreError:
                    if not await confirm_death(cell):
                        raise
                    if cell.alive:
                        self._lose(cell)
                    return False
        return True

    async def _publish(self, result: StepResult) -> None:
        """Publish the step's weights and load them into the live cells' engines; a cell whose
        load failed twice is dropped (the core's failure stops the run)."""
        s = self.state
        s.weights.publish(result.version, result.snapshot)
        s.core.trainer_version = s.weights.version
        failed = await load_published_weights(self.router, s.live(), s.weights)
        for cell in s.live():
            if cell.name in failed:
                why = f"weight load of version {s.weights.version} failed twice"
                self._drop_unloaded(cell, f"{why}: {failed[cell.name]}")

    def _close_step(self, result: StepResult, t_step: float) -> None:
        """Count the step done, record it (`StepLedger.close`), release its groups and show it."""
        s = self.state
        s.steps_done += 1
        r = self.ledger.close(
            step=s.steps_done,
            version=s.weights.version,
            groups=s.batches.step_groups,
            switches=s.switches_done,
            result=result,
            t_step=t_step,
            metrics=self.metrics,
            statistics=lambda: sink_statistics(
                router=self.router,
                rollout=self.rollout,
                weights=s.weights,
                runtime=self.statistics(),
            ),
        )
        logger.info(
            "step %d: v%d, %.1f s, %d executions", r.step, r.version, r.step_s, r.executions
        )
        s.trained = 0
        if s.batches.next_step(s.steps_done):  # the step's groups are released here
            self.ledger.mark_batch_in()
        if self.progress is not None and self.ledger.last_metrics is not None:
            self.progress.step(self.ledger.last_metrics)

    def statistics(self) -> RuntimeStatistics:
        """What the runtime is doing now, as a frozen record (see `RuntimeStatistics`)."""
        return runtime_statistics(self.state, router=self.router, capacity=self.capacity)

    # -- held-out evaluation --------------------------------------------------------------------

    def _start_evaluation(self) -> None:
        """Start the due evaluation on the rollout cells; with none, bring a cell back for it."""
        s = self.state
        if s.eval_due is None or s.evaluating or s.step_running:
            return
        if any(c.role == "rollout" for c in s.live()):
            step, s.eval_due = s.eval_due, None
            s.evaluating = True
            self._spawn(self._evaluate, step)
        elif cell := HeldoutEvaluation.recall(
            s.cells, core_may_leave=not (s.core.has_grads or s.trained)
        ):
            self._begin_switch(cell, "rollout")

    async def _evaluate(self, step: int) -> None:
        """Run the evaluation of `step` on the rollout cells (`HeldoutEvaluation.run`)."""
        s = self.state
        assert s.evaluation is not None
        version = s.weights.version
        await s.evaluation.run(
            step,
            version=version,
            cells=s.cells,
            rollout=self.rollout,
            router=self.router,
            clock=self._now,
            on_change=self._rollout_activity,
            metrics=self.metrics,
            progress=self.progress,
        )
        assert s.weights.version == version, "a step published during an evaluation"
        s.evaluating = False
        self._notify()

    # -- role switches --------------------------------------------------------------------------

    def _begin_switch(
        self, cell: DrivenCell, role: SwitchTarget, leaving: frozenset[int] = frozenset()
    ) -> None:
        """Start `cell`'s switch to `role`; one leaving rollout moves its executions to the least
        loaded rollout cells with room outside `leaving` (the cells this decision moves out of
        rollout), suspending those none has room for."""
        s = self.state
        if cell.role == role or cell.role == "switching":
            raise RuntimeError(
                f"{self.policy.name}: switch of cell {cell.name} ({cell.role}) to {role}"
            )
        if role == "train":
            out = leaving | {cell.index}  # no execution lands on a cell leaving rollout
            s.suspension.move_off(cell, s.live(), self.capacity, out, self._pin)
            if s.evaluation is not None:
                s.evaluation.move_off(cell, s.cells, self.router)
        self._set_role(cell, "switching", role)
        self._spawn(self._switch, cell, role)

    async def _switch(self, cell: DrivenCell, role: SwitchTarget) -> None:
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

    async def _switch_roles(self, cell: DrivenCell, role: SwitchTarget) -> None:
        s = self.state
        t0 = self._now()
        self._activity(cell, "switch", t0)
        await switch_role(cell, role, core=s.core, weights=s.weights, router=self.router)
        if not cell.alive:
            return
        s.switch_s.append(self._now() - t0)
        s.switches_done += 1
        self._set_role(cell, role)
        self._activity(cell, "idle")
        self._rollout_activity(cell)
        self._notify()

    async def _initial_roles(self) -> None:
        s = self.state
        roles = self.policy.initial_roles(len(s.cells), 0)
        async with anyio.create_task_group() as tg:
            for cell, role in zip(s.cells, roles, strict=True):
                if role == "train":
                    self._set_role(cell, "switching", "train")
                    tg.start_soon(self._switch, cell, "train")
        s.switch_s.clear()  # initial roles cost no switch (the policies' contract)
        s.switches_done = 0

    # -- cell deaths ----------------------------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            for cell in await wait_cell_deaths(self.state.live, _WATCH_S):
                self._lose(cell)

    def _drop_unloaded(self, cell: DrivenCell, why: str) -> None:
        """A cell whose engine failed to load the published weights (B17: it may hold half-loaded
        ones) is dropped like a dead cell; the run stops if it is the core or no other rolls out."""
        s = self.state
        others = [c for c in s.live() if c is not cell and "rollout" in (c.role, c.target)]
        if cell is s.core or not others:
            who = "the core cell" if cell is s.core else "the last cell to roll out"
            raise WeightSyncError(f"{cell.name}, {who}: {why}")
        self._lose(cell, f"failed a weight load ({why})")

    def _lose(self, cell: DrivenCell, why: str | None = None) -> None:
        """Drop `cell` (`why`: what happened to it; None: its process exited)."""
        s = self.state
        why = why or f"died (exit {cell.exit_code()})"
        if cell is s.core:
            raise CellDiedError(
                f"core cell {cell.name} {why}: its weights and optimizer state are lost"
            )
        logger.warning("cell %s %s: dropped; its executions move to the others", cell.name, why)
        cell.alive = False
        self.router.retire(cell.name, why)
        self._activity(cell, "idle")
        s.suspension.rehome(cell, s.live(), self._pin)
        if s.evaluation is not None:
            s.evaluation.move_off(cell, s.cells, self.router)
        for group in cell.trained_groups:  # its gradients died with it
            s.trained -= self.G
            s.batches.queue.appendleft(group)
        cell.trained_groups = []
        cell.has_grads = False
        self._water()
        self._notify()
