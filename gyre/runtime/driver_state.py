"""The elastic driver's run state: one typed record of everything a run changes as it goes.

Owns `DriverState`: the cells as the driver tracks them, the published weights, the counters the
policy sees (dispatched, finished, trained, ...), batch formation, suspension, the held-out
evaluation's progress and the role switches done. `gyre.runtime.elastic.ElasticRuntime` is its
one writer while it runs; the journal (`gyre.runtime.elastic_resume`) writes a resumed run's
position into it before the first decision and reads it for each checkpoint;
`gyre.runtime.step_ledger.runtime_statistics` reads it for `RuntimeStatistics`. Configuration
(batch size, group size, capacity) stays on the runtime. Knows nothing about how the state
changes: the driver decides that.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gyre.runtime.batch_formation import BatchFormation, Group
from gyre.runtime.cell_handle import DrivenCell
from gyre.runtime.evaluation import HeldoutEvaluation
from gyre.runtime.scheduler import CellView, SchedulerState
from gyre.runtime.suspension import Suspension
from gyre.runtime.weight_version import WeightVersion

__all__ = ["DriverState"]


@dataclass(kw_only=True, eq=False)
class DriverState:
    """The mutable state of one elastic run; counters are since the run started (a resumed run:
    since its first launch) unless named otherwise."""

    cells: list[DrivenCell]
    """Every cell the run was given, in order (`cells[0]` is the core); dead ones stay, not
    alive."""
    weights: WeightVersion
    """The published weights: the step bumps them, switches and trainers read them."""
    batches: BatchFormation[Group]
    """Groups dispatching, the current step's batch, its training queue and the backlog."""
    suspension: Suspension
    """Executions a role switch left without a rollout cell with room."""
    steps_target: int
    """The step the run ends after (`ElasticRuntime.run`'s argument)."""
    steps_done: int = 0
    """Optimizer steps completed (the current step is `steps_done + 1`)."""
    dispatched: int = 0
    """Training executions started."""
    finished: int = 0
    """Training executions ended (finished, stopped or failed)."""
    trained: int = 0
    """Executions of the current step whose gradients are in a trainer."""
    running: int = 0
    """Groups being trained now."""
    step_running: bool = False
    """The optimizer step of the current step runs on the core."""
    where: dict[str, DrivenCell] = field(default_factory=dict)
    """Training executions in flight -> the cell they are pinned to (a suspended one: the cell
    it left)."""
    evaluation: HeldoutEvaluation | None = None
    """The run's held-out evaluations (None until `run` starts)."""
    eval_due: int | None = None
    """The step whose weights wait for their evaluation (it starts on a rollout cell)."""
    evaluating: bool = False
    """A held-out evaluation runs (no step publishes meanwhile)."""
    switch_s: list[float] = field(default_factory=list)
    """Seconds of each completed role switch (the initial roles are not switches)."""
    switches_done: int = 0
    """Role switches completed."""

    @property
    def core(self) -> DrivenCell:
        """The core cell: its trainer holds the optimizer and takes the step."""
        return self.cells[0]

    def live(self) -> list[DrivenCell]:
        """The cells not dropped, in order (the policy numbers these)."""
        return [c for c in self.cells if c.alive]

    @property
    def water_level(self) -> int:
        """Unfinished training executions: ``dispatched - finished``."""
        return self.dispatched - self.finished

    def scheduler_state(
        self, *, capacity: int, batch_executions: int, group_size: int
    ) -> SchedulerState:
        """What the policy sees now: the live cells (numbered in order) and the counters, with
        `capacity` per cell raised to the fullest live cell's load (survivors of a lost cell may
        hold more than their capacity)."""
        live = self.live()
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
            capacity_per_cell=max([capacity, *(len(c.executions) for c in live)]),
            batch_executions=batch_executions,
            dispatched=self.dispatched,
            finished=self.finished,
            steps_done=self.steps_done,
            train_ready=group_size * len(self.batches.queue),
            train_running=self.running,
            trained=self.trained,
            step_running=self.step_running,
            suspended=len(self.suspension.queue),
        )
