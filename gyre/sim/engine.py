"""Discrete-event cluster simulator: one scheduler policy, one workload, simulated seconds.

Owns `simulate(config, policy)` and its record `SimResult`, whose `Timeline` (the runtime's
type, `gyre.runtime.timeline`) holds what every cell did. A heapq event queue holds execution
finishes, switch completions, micro-batch completions, weight loads and optimizer steps; after
every instant the simulator snapshots the cluster into the runtime's `SchedulerState`,
calls the policy's `decide` (the real objects from `gyre.runtime.scheduler`, never a copy of their
logic) and applies the returned actions until the policy has nothing more to do.

The mechanics it shares with the node runtime are the runtime's own code: batch formation
(`gyre.runtime.batch_formation`: streaming, first finished or dispatched; `PolicyConfig`), the
decide loop, placement (least loaded first, within capacity) and handing ready groups to idle
training cells in order, a group at a time, loading the published weights first when the cell's
trainer is behind (`gyre.runtime.mechanics`). Its own: the clock, migrating the executions of a
cell leaving rollout (delayed by KV bytes / bandwidth) or, when no rollout cell that stays has
room, suspending them (partial rollouts: an execution's clock stops until a rollout slot is free
again, then it resumes after restoring its KV), weight loads on rollout cells after each update.
It knows nothing about engines or processes. Every execution index draws the same duration under
every policy (common random numbers).
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import msgspec
import numpy as np

from gyre.cell.wire import CellRole
from gyre.errors import SimulationStalled
from gyre.runtime.batch_formation import BatchFormation
from gyre.runtime.mechanics import assign_training, decide_until_idle, least_loaded
from gyre.runtime.scheduler import CellView, SchedulerPolicy, SchedulerState, SwitchTarget
from gyre.runtime.timeline import Interval, Timeline
from gyre.runtime.weight_version import WeightVersion
from gyre.sim.config import SimConfig

__all__ = ["SimResult", "Workload", "simulate", "SimulationStalled"]

_FINISH, _SWITCH, _TRAIN, _STEP = range(4)


class SimResult(msgspec.Struct, frozen=True, kw_only=True):
    """Outcome of one simulated run (all times in simulated seconds)."""

    policy: str
    makespan_s: float
    """Time at which the last of `num_steps` optimizer steps completed."""
    step_end_s: tuple[float, ...]
    utilisation: float
    """Useful cell-seconds / (cells x makespan); useful = rollout slot-seconds / slots per cell +
    training compute + optimizer steps."""
    work_cell_s: float
    """Useful cell-seconds of the executions trained in the run (intrinsic durations)."""
    lower_bound_s: float
    """max(work_cell_s / cells, max over trained executions of duration + its training +
    optimizer step): no schedule can finish sooner."""
    switches: int
    migrations: int
    suspensions: int
    """Times an execution was suspended because its cell left rollout and no rollout cell that
    stays had room (each resumes later, before any new dispatch)."""
    dispatched: int
    trained_executions: int
    """Executions whose gradients went into a completed step (each exactly once)."""
    step_groups: tuple[tuple[int, ...], ...]
    """The groups (index = execution index // group_size) of each completed step's batch, in the
    order they joined it."""
    max_staleness_steps: int
    """Largest (step that trained it - weight version it started with) over trained executions."""
    timeline: Timeline


class Workload:
    """Durations, tokens and training seconds per execution index, drawn once from the seed."""

    def __init__(self, config: SimConfig):
        self._config = config
        self._rng = np.random.default_rng(config.workload.seed)
        self.duration_s: list[float] = []
        self.tokens: list[float] = []
        self.train_s: list[float] = []

    def ensure(self, n: int) -> None:
        """Draw durations until at least `n` executions exist."""
        w = self._config.workload
        while len(self.duration_s) < n:
            z = self._rng.standard_normal(max(n - len(self.duration_s), 4 * w.batch_executions))
            d = np.minimum(w.median_duration_s * np.exp(w.sigma * z), w.timeout_s)
            for di in d.tolist():
                tok = w.tokens(di)
                self.duration_s.append(di)
                self.tokens.append(tok)
                self.train_s.append(self._config.train_s(tok))


class _SimGroup:
    """The `size` executions of group `index` (indices ``index*size ..``), trained as one unit."""

    __slots__ = ("index", "members", "train_s", "left")

    def __init__(self, index: int, size: int, train_s: float):
        self.index = index
        self.members = range(index * size, (index + 1) * size)
        self.train_s = train_s
        """Seconds one training cell needs for all its members' micro-batches."""
        self.left = size
        """Members still running."""


class _SimCell:
    """One simulated cell: its role, executions, busy flag and the weight version it holds."""

    __slots__ = (
        "index",
        "role",
        "target",
        "executions",
        "busy",
        "held_version",
        "since",
        "sync_until",
    )

    def __init__(self, index: int, role: CellRole):
        self.index = index
        self.role = role
        self.target: SwitchTarget | None = None
        self.executions: set[int] = set()
        self.busy = False
        self.held_version = 0
        self.since = 0.0
        self.sync_until = 0.0  # a rollout cell loading new weights serves nothing before this


def simulate(
    config: SimConfig,
    policy: SchedulerPolicy,
    workload: Workload | None = None,
    streaming: bool | None = None,
) -> SimResult:
    """Run `config.workload.num_steps` steps under `policy`; see the module docstring.

    `streaming` defaults to ``config.policies.streaming(policy.name)``; without streaming the batch
    is formed as ``config.policies.unstreamed_batch`` says. Pass the same `workload` to several
    calls to give every policy the same execution durations.
    """
    if streaming is None:
        streaming = config.policies.streaming(policy.name)
    return _Sim(config, policy, workload or Workload(config), streaming).run()


class _Sim:
    def __init__(
        self, config: SimConfig, policy: SchedulerPolicy, workload: Workload, streaming: bool
    ):
        self.cfg = config
        self.policy = policy
        self.wl = workload
        w = config.workload
        self.C = config.cluster.num_cells
        self.cap = config.capacity_per_cell()
        self.B = w.batch_executions
        self.G = w.group_size
        self.batches: BatchFormation[_SimGroup] = BatchFormation(
            groups_per_batch=self.B // self.G,
            streaming=streaming,
            unstreamed=config.policies.unstreamed_batch,
        )
        self.groups: list[_SimGroup] = []
        self.sync_s = config.weight_sync_s()
        self.opt_s = config.costs.optimizer_step_s
        roles = policy.initial_roles(self.C, 0)
        if len(roles) != self.C:
            raise ValueError(
                f"{policy.name}: initial_roles gave {len(roles)} roles for num_cells={self.C}"
            )
        self.cells = [_SimCell(i, r) for i, r in enumerate(roles)]
        self.views: list[CellView | None] = [None] * self.C
        self.t = 0.0
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        # executions
        self.ex_cell: list[int] = []
        self.ex_start: list[float] = []
        self.ex_end: list[float] = []
        self.ex_gen: list[int] = []
        self.ex_version: list[int] = []
        self.ex_paused_s: list[float] = []  # seconds spent suspended (ended suspensions)
        self.suspended: deque[int] = deque()  # suspended executions, resumed first in, first out
        self.suspended_at: dict[int, float] = {}
        self.left_s: dict[int, float] = {}  # a suspended execution's remaining seconds
        self.dispatched = 0
        self.finished = 0
        # batches
        self.weights = WeightVersion()
        """Published weight version (no folder: nothing is saved); the step bumps it."""
        self.trained = 0
        self.running = 0
        self.step_running = False
        self.trained_execs: list[tuple[int, int]] = []  # (exec, step)
        self.trained_set: set[int] = set()
        self.step_end: list[float] = []
        self.step_groups: list[tuple[int, ...]] = []
        # records
        self.intervals: list[Interval] = []
        self.water_t: list[float] = [0.0]
        self.water: list[int] = [0]
        self.capacity: list[int] = [self._rollout_capacity()]
        self.switches = 0
        self.migrations = 0
        self.suspensions = 0
        self.train_busy_s = 0.0

    # ---- helpers -------------------------------------------------------------------------------

    def _push(self, at: float, kind: int, a: int = 0, b: int = 0) -> None:
        if math.isfinite(at):
            self.seq += 1
            heapq.heappush(self.heap, (at, self.seq, kind, a, b))

    def _rollout_capacity(self) -> int:
        return self.cap * sum(c.role == "rollout" for c in self.cells)

    def _trace(self) -> None:
        self.water_t.append(self.t)
        self.water.append(self.dispatched - self.finished)
        self.capacity.append(self._rollout_capacity())

    def _set_role(self, cell: _SimCell, role: CellRole, target: SwitchTarget | None = None) -> None:
        if cell.role in ("rollout", "switching") and self.t > cell.since:
            self.intervals.append(
                Interval(
                    cell.index,
                    cell.since,
                    self.t,
                    "rollout" if cell.role == "rollout" else "switch",
                )
            )
        cell.role, cell.target, cell.since = role, target, self.t
        self.views[cell.index] = None

    def _state(self) -> SchedulerState:
        views = self.views
        for c in self.cells:
            if views[c.index] is None:
                views[c.index] = CellView(
                    index=c.index,
                    role=c.role,
                    is_core=c.index == 0,
                    switching_to=c.target,
                    executions=len(c.executions),
                    busy=c.busy,
                )
        return SchedulerState(
            cells=tuple(views),  # type: ignore[arg-type]
            capacity_per_cell=self.cap,
            batch_executions=self.B,
            dispatched=self.dispatched,
            finished=self.finished,
            steps_done=self.weights.version,  # every simulated step publishes
            train_ready=self.G * len(self.batches.queue),
            train_running=self.running,
            trained=self.trained,
            step_running=self.step_running,
            suspended=len(self.suspended),
        )

    def _least_loaded(self, avoid: frozenset[int] = frozenset()) -> _SimCell | None:
        return least_loaded(self.cells, capacity=self.cap, avoid=avoid)

    def _done_tokens(self, e: int, left_s: float) -> float:
        """Context tokens execution `e` holds with `left_s` of its duration still to run."""
        d = self.wl.duration_s[e]
        done = min(1.0, max(0.0, 1.0 - left_s / d)) if d > 0 else 1.0
        return self.wl.tokens[e] * done

    def _reschedule(self, e: int, delay: float) -> None:
        self.ex_end[e] += delay
        self.ex_gen[e] += 1
        self._push(self.ex_end[e], _FINISH, e, self.ex_gen[e])

    # ---- actions -------------------------------------------------------------------------------

    def _dispatch(self, n: int) -> None:
        self.wl.ensure(self.dispatched + n)
        for _ in range(n):
            e = self.dispatched
            cell = self._least_loaded()
            assert cell is not None, "no rollout cell has a free slot"
            cell.executions.add(e)
            self.views[cell.index] = None
            end = max(self.t, cell.sync_until) + self.wl.duration_s[e]
            self.ex_cell.append(cell.index)
            self.ex_start.append(self.t)
            self.ex_end.append(end)
            self.ex_gen.append(0)
            self.ex_version.append(self.weights.version)
            self.ex_paused_s.append(0.0)
            if e % self.G == 0:
                g = e // self.G
                self.wl.ensure(e + self.G)
                train_s = sum(self.wl.train_s[m] for m in range(e, e + self.G))
                self.groups.append(_SimGroup(g, self.G, train_s))
            self.dispatched += 1
            self._push(end, _FINISH, e, 0)
        self._trace()

    def _switch_to_train(self, i: int, leaving: frozenset[int]) -> None:
        """Cell `i` leaves rollout; `leaving`: every cell this decision moves out of rollout.

        Its executions migrate to rollout cells that stay; those that find no room are suspended.
        """
        cell = self.cells[i]
        moving = sorted(cell.executions)
        cell.executions.clear()
        for e in moving:
            dest = self._least_loaded(avoid=leaving | {i})
            if dest is None:
                self._suspend(e)
                continue
            dest.executions.add(e)
            self.views[dest.index] = None
            self.ex_cell[e] = dest.index
            d = self.wl.duration_s[e]
            done = min(1.0, (self.t - self.ex_start[e]) / d) if d > 0 else 1.0
            self._reschedule(e, self.cfg.migration_s(self.wl.tokens[e] * done))
            self.migrations += 1
        self.switches += 1
        self._set_role(cell, "switching", "train")
        self._push(self.t + self.cfg.costs.switch_to_train_s, _SWITCH, i)
        self._trace()

    def _suspend(self, e: int) -> None:
        """Stop execution `e`'s clock: the agent's next model call waits for a rollout slot (tool
        work in progress at the switch is not credited) and its KV leaves the cell."""
        self.left_s[e] = max(0.0, self.ex_end[e] - self.t)
        self.ex_gen[e] += 1  # its pending finish is stale
        self.ex_cell[e] = -1
        self.suspended_at[e] = self.t
        self.suspended.append(e)
        self.suspensions += 1

    def _resume(self) -> None:
        """Put suspended executions on rollout cells with room, first suspended first.

        Each waits for its cell's weights, restores its KV (bytes / KV bandwidth), then runs the
        seconds it had left."""
        resumed = False
        while self.suspended:
            cell = self._least_loaded()
            if cell is None:
                break
            e = self.suspended.popleft()
            left = self.left_s.pop(e)
            self.ex_paused_s[e] += self.t - self.suspended_at.pop(e)
            cell.executions.add(e)
            self.views[cell.index] = None
            self.ex_cell[e] = cell.index
            restore = self.cfg.migration_s(self._done_tokens(e, left))
            self.ex_end[e] = max(self.t, cell.sync_until) + restore + left
            self._push(self.ex_end[e], _FINISH, e, self.ex_gen[e])
            resumed = True
        if resumed:
            self._trace()

    def _switch_to_rollout(self, i: int) -> None:
        cell = self.cells[i]
        self.switches += 1
        self._set_role(cell, "switching", "rollout")
        self._push(self.t + self.cfg.costs.switch_to_rollout_s, _SWITCH, i)

    def _start_step(self) -> None:
        core = self.cells[0]
        core.busy = True
        self.views[0] = None
        self.step_running = True
        self.intervals.append(Interval(0, self.t, self.t + self.opt_s, "step"))
        self._push(self.t + self.opt_s, _STEP)

    # ---- training ------------------------------------------------------------------------------

    def _train(self, cell: _SimCell, group: _SimGroup) -> None:
        """`cell` trains `group`, after loading the published weights if its trainer is behind
        (as `gyre.runtime.cell_training.train_group` does)."""
        cell.busy = True
        self.views[cell.index] = None
        start = self.t
        if self.weights.is_stale(cell.held_version):
            start += self.sync_s
            self.intervals.append(Interval(cell.index, self.t, start, "load"))
            cell.held_version = self.weights.version
        self.running += 1
        self.train_busy_s += group.train_s
        self.intervals.append(Interval(cell.index, start, start + group.train_s, "train"))
        self._push(start + group.train_s, _TRAIN, cell.index, group.index)

    # ---- events --------------------------------------------------------------------------------

    def _handle(self, kind: int, a: int, b: int) -> bool:
        """Apply one event; False if it was stale."""
        if kind == _FINISH:
            if b != self.ex_gen[a]:
                return False
            cell = self.cells[self.ex_cell[a]]
            cell.executions.discard(a)
            self.views[cell.index] = None
            self.finished += 1
            group = self.groups[a // self.G]
            group.left -= 1
            if group.left == 0:
                self.batches.complete(group, self.weights.version)
            self._trace()
        elif kind == _SWITCH:
            cell = self.cells[a]
            self._set_role(cell, cell.target or "rollout")
            cell.held_version = self.weights.version
            self._trace()
        elif kind == _TRAIN:
            cell = self.cells[a]
            cell.busy = False
            self.views[a] = None
            self.running -= 1
            self.trained += self.G
            for e in self.groups[b].members:
                assert e not in self.trained_set, f"execution {e} trained twice"
                self.trained_set.add(e)
                self.trained_execs.append((e, self.weights.version))
        elif kind == _STEP:
            self.cells[0].busy = False
            self.cells[0].held_version = self.weights.version + 1
            self.views[0] = None
            self.step_running = False
            self.weights.publish(self.weights.version + 1)
            self.trained = 0
            self.step_end.append(self.t)
            self.step_groups.append(tuple(g.index for g in self.batches.step_groups))
            for cell in self.cells:
                if cell.role == "rollout":
                    cell.sync_until = self.t + self.sync_s
                    self.intervals.append(Interval(cell.index, self.t, cell.sync_until, "load"))
                    for e in cell.executions:
                        self._reschedule(e, self.sync_s)
            self.batches.next_step(self.weights.version)
        return True

    def _prepare(self) -> None:
        """What happens without the policy: suspended executions resume, ready groups train."""
        self._resume()
        assign_training(
            self.cells, self.batches.queue, step_running=self.step_running, start=self._train
        )

    def _decide(self) -> None:
        try:
            decide_until_idle(
                self.policy,
                prepare=self._prepare,
                state=self._state,
                dispatch=self._dispatch,
                switch_to_train=self._switch_to_train,
                switch_to_rollout=self._switch_to_rollout,
                start_step=self._start_step,
                stalled=SimulationStalled,
            )
        except SimulationStalled as exc:
            raise SimulationStalled(f"{exc} at t={self.t}") from None

    def run(self) -> SimResult:
        steps = self.cfg.workload.num_steps
        self._decide()
        while len(self.step_end) < steps:
            if not self.heap:
                raise SimulationStalled(
                    f"{self.policy.name}: nothing pending at t={self.t:.1f}s after "
                    f"{len(self.step_end)} of "
                    f"{steps} steps; state {self._state()}"
                )
            self.t = self.heap[0][0]
            while self.heap and self.heap[0][0] == self.t:
                _, _, kind, a, b = heapq.heappop(self.heap)
                self._handle(kind, a, b)
            if len(self.step_end) < steps:
                self._decide()
        return self._result()

    def _result(self) -> SimResult:
        end = self.t
        for cell in self.cells:
            self._set_role(cell, cell.role, cell.target)
        wl, cap, C = self.wl, self.cap, self.C
        paused = list(self.ex_paused_s)
        for e, since in self.suspended_at.items():
            paused[e] += end - since
        rollout_slot_s = sum(
            min(end - self.ex_start[e] - paused[e], wl.duration_s[e])
            for e in range(self.dispatched)
        )
        train_done_s = sum(wl.train_s[e] for e, _ in self.trained_execs)
        opt_total = self.opt_s * len(self.step_end)
        useful = rollout_slot_s / cap + train_done_s + opt_total
        work = (
            sum(wl.duration_s[e] / cap + wl.train_s[e] for e, _ in self.trained_execs) + opt_total
        )
        longest = max(
            (wl.duration_s[e] + wl.train_s[e] for e, _ in self.trained_execs), default=0.0
        )
        staleness = max((s - self.ex_version[e] for e, s in self.trained_execs), default=0)
        return SimResult(
            policy=self.policy.name,
            makespan_s=end,
            step_end_s=tuple(self.step_end),
            utilisation=useful / (C * end) if end > 0 else 0.0,
            work_cell_s=work,
            lower_bound_s=max(work / C, longest + self.opt_s),
            switches=self.switches,
            migrations=self.migrations,
            suspensions=self.suspensions,
            dispatched=self.dispatched,
            trained_executions=len(self.trained_execs),
            step_groups=tuple(self.step_groups),
            max_staleness_steps=staleness,
            timeline=Timeline(
                intervals=tuple(self.intervals),
                water_t_s=tuple(self.water_t),
                water_level=tuple(self.water),
                rollout_capacity=tuple(self.capacity),
            ),
        )
