"""Held-out evaluation of a run: when it is due, where its executions run, what it found.

Owns `HeldoutEvaluation`: the steps at which the held-out tasks are evaluated (before the first
step, every `loop.eval_every` steps and after the last; a step already in `metrics.jsonl` is not
evaluated again), the evaluation executions of one step (`eval_group_size` per held-out task,
with ids `eval<step>-<launch>-t<task>-g<slot>`), their placement on rollout cells (least loaded
first, moved off a cell that leaves rollout; the policy does not count them), running them and
their `EvalMetrics` record; and `hold`, the policy actions the driver holds while an evaluation
is due or running (the step, so one evaluation sees one published weight version, and switches
that would leave its executions no rollout cell). Knows nothing about how cells switch or train:
the driver (`gyre.runtime.elastic`) decides when an evaluation starts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import anyio

from gyre.config import RunConfig
from gyre.rollout.source import Executed, RolloutSource
from gyre.routing.router import Router
from gyre.runtime.cell_handle import DrivenCell
from gyre.runtime.data_stream import evaluated, pass_rate
from gyre.runtime.metrics import EvalMetrics, MetricsWriter
from gyre.runtime.progress import Progress
from gyre.runtime.scheduler import Action, Dispatch, StartStep, SwitchToTrain
from gyre.tasks.task import Task

__all__ = ["HeldoutEvaluation", "hold"]


def hold(
    actions: Sequence[Action], *, evaluation: bool, over: bool, rollout_cells: int
) -> tuple[Action, ...]:
    """`actions` less those the driver holds. With `evaluation` (one due or running): the
    `StartStep` (no weights change under it) and every `SwitchToTrain` when together they would
    leave none of the `rollout_cells` live rollout cells. With `over` (the run's steps are done):
    the step and every `Dispatch`."""
    if not evaluation and not over:
        return tuple(actions)
    leaving = sum(isinstance(a, SwitchToTrain) for a in actions)
    return tuple(
        a
        for a in actions
        if not isinstance(a, StartStep)
        and not (over and isinstance(a, Dispatch))
        and not (evaluation and isinstance(a, SwitchToTrain) and leaving >= rollout_cells)
    )


class HeldoutEvaluation:
    """The evaluations of a run of `steps` steps over `heldout` tasks.

    Args:
        heldout: the held-out tasks (none: nothing is ever due).
        group_size: executions per task in one evaluation (`loop.eval_group_size`, >= 1).
        every: evaluate every N steps as well (`loop.eval_every`; 0: only the first and last).
        steps: the run's last step (`loop.steps`).
        launch: part of every execution id (a restarted run never reuses one).
        run_dir: the run folder; a step whose evaluation its `metrics.jsonl` already holds is not
            due (a resumed run).
    Raises:
        ValueError: group_size < 1, every < 0 or steps < 1.
    """

    def __init__(
        self,
        heldout: Sequence[Task],
        *,
        group_size: int,
        every: int,
        steps: int,
        launch: str,
        run_dir: Path,
    ) -> None:
        if group_size < 1 or every < 0 or steps < 1:
            raise ValueError(f"{group_size=} must be >= 1, {every=} >= 0 and {steps=} >= 1")
        self.heldout = list(heldout)
        self.group_size = group_size
        self.every = every
        self.steps = steps
        self.launch = launch
        self.run_dir = run_dir
        self.where: dict[str, DrivenCell] = {}
        """Evaluation executions in flight -> the cell they are pinned to."""

    @classmethod
    def of(
        cls, config: RunConfig, heldout: Sequence[Task], steps: int, launch: str
    ) -> HeldoutEvaluation:
        """The evaluations `config.loop` asks for over `heldout`, in a run of `steps` steps."""
        loop = config.loop
        return cls(
            heldout,
            group_size=loop.eval_group_size,
            every=loop.eval_every,
            steps=steps,
            launch=launch,
            run_dir=Path(config.run_dir).resolve(),
        )

    def due(self, step: int) -> bool:
        """Whether the weights published by `step` steps are evaluated: step 0, every
        `every`-th step, and the last step, unless `metrics.jsonl` already has that evaluation."""
        if not self.heldout:
            return False
        every = self.every > 0 and step % self.every == 0
        scheduled = step in (0, self.steps) or (every and 0 < step < self.steps)
        return scheduled and not evaluated(self.run_dir, step)

    def jobs(self, step: int) -> list[tuple[Task, str]]:
        """(task, execution id) of the evaluation at `step`, task by task."""
        return [
            (task, f"eval{step}-{self.launch}-t{i}-g{j}")
            for i, task in enumerate(self.heldout)
            for j in range(self.group_size)
        ]

    def record(
        self, step: int, version: int, executed: Sequence[Executed], eval_s: float
    ) -> EvalMetrics:
        """The `EvalMetrics` of the evaluation at `step`, run at weight `version` in `eval_s`
        seconds: pass rate and mean reward of its scored executions (`pass_rate`)."""
        rate, reward = pass_rate(executed)
        return EvalMetrics(
            step=step,
            version=version,
            split="heldout",
            executions=len(executed),
            pass_rate=rate,
            mean_reward=reward,
            eval_s=eval_s,
        )

    def load(self, cell: DrivenCell) -> int:
        """Evaluation executions pinned to `cell`."""
        return sum(c is cell for c in self.where.values())

    def place(self, cells: Sequence[DrivenCell], avoid: DrivenCell | None = None) -> DrivenCell:
        """The live rollout cell of `cells` (not `avoid`) with the fewest executions, training and
        evaluation together. Raises `RuntimeError` when there is none."""
        pool = [c for c in cells if c.alive and c.role == "rollout" and c is not avoid]
        if not pool:
            raise RuntimeError("no rollout cell for an evaluation execution")
        return min(pool, key=lambda c: (len(c.executions) + self.load(c), c.index))

    def move_off(self, cell: DrivenCell, cells: Sequence[DrivenCell], router: Router) -> None:
        """Pin the evaluation executions on `cell` (leaving rollout, or dead) to other cells."""
        for execution_id in sorted(e for e, c in self.where.items() if c is cell):
            target = self.place(cells, avoid=cell)
            router.pin(execution_id, target.name)
            self.where[execution_id] = target

    async def run(
        self,
        step: int,
        *,
        version: int,
        cells: Sequence[DrivenCell],
        rollout: RolloutSource,
        router: Router,
        clock: Callable[[], float],
        on_change: Callable[[DrivenCell], None],
        metrics: MetricsWriter | None = None,
        progress: Progress | None = None,
    ) -> EvalMetrics:
        """Run the evaluation of `step` at weight `version`: every job at once, each pinned in
        `router` to the least loaded rollout cell of `cells` (`on_change(cell)` after a cell
        gained or lost one); its record (`clock()` in seconds) is written to `metrics` and shown
        by `progress` (each if not None) and returned."""
        t0 = clock()
        executed: list[Executed] = []

        async def one(task: Task, execution_id: str) -> None:
            try:
                executed.append(await rollout.run(task, execution_id))
            finally:
                cell = self.where.pop(execution_id)
                router.end_execution(execution_id)
                on_change(cell)

        async with anyio.create_task_group() as tg:
            for task, execution_id in self.jobs(step):
                cell = self.place(cells)
                router.pin(execution_id, cell.name)
                self.where[execution_id] = cell
                on_change(cell)
                tg.start_soon(one, task, execution_id)
        record = self.record(step, version, executed, clock() - t0)
        if metrics is not None:
            metrics.write(record)
        if progress is not None:
            progress.eval(record)
        return record

    @staticmethod
    def recall(cells: Sequence[DrivenCell], *, core_may_leave: bool) -> DrivenCell | None:
        """The idle training cell to bring back to rollout for an evaluation when no live cell
        rolls out or is on its way: a satellite (highest index) first, the core only if
        `core_may_leave` (no gradients of the step on it); None when there is none or one is
        already coming back."""
        live = [c for c in cells if c.alive]
        if any(c.role == "rollout" or c.target == "rollout" for c in live):
            return None
        idle = [c for c in live if c.role == "train" and not c.busy]
        idle = [c for c in idle if c.index != 0 or core_may_leave]
        return max(idle, key=lambda c: (c.index != 0, c.index), default=None)
