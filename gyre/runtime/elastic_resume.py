"""The elastic runtime's durable record, and its `--resume` after a kill of the node.

Owns `RunJournal`. While `gyre.runtime.elastic.ElasticRuntime` runs, the journal appends every
finished execution to the ledger (`executions.jsonl`: task, group, member, outcome; fsynced before
its group can train) and, after every step, writes a checkpoint (`gyre.runtime.checkpoint`): the
core cell's trainer (weights, optimizer, RNG and version, its `save_checkpoint` RPC) under
`trainer/deepspeed`, the published weights under `trainer/weights` (hard links of the snapshot)
and a `LoopState`: steps, weight version, executions dispatched, the groups begun and not yet
trained, the executions in flight. A resumed run (`RunJournal.open` on `check_run_dir`'s
checkpoint) loads that trainer into the core (converted first when the core's rank count changed:
`gyre.runtime.trainer_checkpoint`) and those weights into every cell (`restore_cells`), continues
the run clock where `timeline.jsonl` ends, drops the metrics lines of steps after the checkpoint
(they are trained again), rebuilds every untrained group from the ledger and the call log (one
streaming pass, its torn tail cut) and runs again, under new IDs, exactly the executions of those
groups that had not finished (`begin`). Each start is one line of `launches.jsonl`: its launch ID
(part of every execution ID, never reused in a run folder), what it recovered and what it runs
again, and why, and what it trains with (`launch_settings`), which `check_resume_config` holds a
later `--resume` to. Knows nothing about policies, HTTP or what a cell runs inside.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec

from gyre.cell.client import CellClient
from gyre.config import RESUME_FIXED, RunConfig, resume_fixed
from gyre.errors import ConfigError, RunDirError
from gyre.rollout.source import Executed
from gyre.rollout.tasks import pick_tasks, split_digest
from gyre.runtime.batch import group_batch
from gyre.runtime.batch_formation import Group
from gyre.runtime.checkpoint import (
    ExecutionLedger,
    LedgerEntry,
    LoopState,
    save_checkpoint_async,
)
from gyre.runtime.driver_state import DriverState
from gyre.runtime.metrics import METRICS_FILE, append_line
from gyre.runtime.step_ledger import StepLedger
from gyre.runtime.timeline import TIMELINE_FILE, read_timeline
from gyre.runtime.trainer_checkpoint import TRAINER_DIR, WEIGHTS_DIR, checkpoint_to_load
from gyre.tasks.task import Task
from gyre.tito.log import read_log

__all__ = [
    "LAUNCHES_FILE",
    "Launch",
    "Rerun",
    "RunJournal",
    "check_resume_config",
    "launch_settings",
]

logger = logging.getLogger(__name__)

LAUNCHES_FILE = "launches.jsonl"


class Rerun(msgspec.Struct, frozen=True, kw_only=True):
    """An execution a resumed run runs again: member `member` of group `group`."""

    group: int
    member: int
    execution_id: str
    """Its new ID (this launch's)."""
    was: str | None
    """The killed run's ID of it, when the checkpoint recorded it in flight (None: dispatched
    after the checkpoint, or its ledger line has no closed execution in the call log)."""
    reason: str


class Launch(msgspec.Struct, frozen=True, kw_only=True):
    """One start of a run (a line of `launches.jsonl`)."""

    launch: str
    resumed_from_step: int | None
    """The checkpoint's step (0: a resume without a checkpoint); None: a fresh run."""
    version: int
    dispatched: int = 0
    """Executions dispatched before this start (the checkpoint's, or beyond it up to the last
    that finished): later ones of the killed run, which never finished, are dispatched anew."""
    recovered: list[str] = []
    """Finished, untrained executions of earlier launches reused from the ledger and call log."""
    rerun: list[Rerun] = []
    settings: dict[str, Any] = {}
    """What this start trains with: the config's `RESUME_FIXED` settings
    (`gyre.config.resume_fixed`) and, under `tasks`, the task split (`split_digest`); empty in
    launches written before they were recorded."""


def launch_settings(
    config: RunConfig, train: Sequence[Task], heldout: Sequence[Task]
) -> dict[str, Any]:
    """`Launch.settings` of a start with `config` and the task split `train`, `heldout`: plain JSON
    data, `resume_fixed(config)` (dotted keys) plus `"tasks"`: `split_digest(train, heldout)`."""
    return {**resume_fixed(config), "tasks": split_digest(train, heldout)}


def check_resume_config(
    run_dir: Path,
    config: RunConfig,
    train: Sequence[Task],
    heldout: Sequence[Task],
    *,
    trained: bool,
) -> None:
    """Raise `ConfigError` when `config` (with its task split `train`, `heldout`) changes what the
    run in `run_dir` trained with (`launch_settings`): each changed key with the run's value and
    the config's, before anything is started. The run's values are its last recorded launch's.
    Only a run that `trained` (it holds a checkpoint) is held to them: a start that failed before
    its first step trained nothing; and a run with no launch recorded (or only launches of an
    older gyre) passes. A key the run's launch lacks (a setting added since; `trainer.adam_eps`)
    held its default then: the behaviour of the gyre that recorded it."""
    recorded = next((x.settings for x in reversed(_read_launches(run_dir)) if x.settings), None)
    if recorded is None or not trained:
        return
    recorded = {**resume_fixed(RunConfig()), **recorded}
    now = launch_settings(config, train, heldout)
    changed = [
        f"{key} = {now[key]!r} (the run: {recorded[key]!r})"
        for key in (*RESUME_FIXED, "tasks")
        if key in recorded and recorded[key] != now[key]
    ]
    if changed:
        raise ConfigError(
            f"--resume of {str(run_dir)!r} with settings the run was not trained with: "
            f"{'; '.join(changed)}. Resume with the run's own values (its launches.jsonl holds "
            "them) or start a new run_dir"
        )


class RunJournal:
    """The ledger, checkpoints and restart of one elastic run; see the module docstring.

    Build it with `await RunJournal.open(...)` before the cells start; pass it to the runtime,
    which calls `finished` when an execution ends, `checkpoint` after each step, and
    `continue_clock` and `begin` when it starts.
    """

    def __init__(
        self,
        config: RunConfig,
        run_dir: Path,
        *,
        state: LoopState,
        trainer_dir: Path | None,
        launch: str,
        recovered: dict[tuple[int, int], Executed],
        reruns: list[Rerun],
        dispatched: int,
        untrained: list[int],
        clock_offset_s: float,
        load_dir: Path | None = None,
    ) -> None:
        self.config = config
        self.run_dir = run_dir
        self.state = state
        """The checkpoint resumed from (`LoopState()` for a fresh run)."""
        self.trainer_dir = trainer_dir
        """Its `trainer/` folder (None: no checkpoint)."""
        if load_dir is None and trainer_dir is not None:
            load_dir = trainer_dir / TRAINER_DIR
        self.load_dir = load_dir
        """The DeepSpeed folder the core loads: the checkpoint's, or its conversion (`open`)."""
        self.launch = launch
        self.ledger = ExecutionLedger(run_dir)
        self.clock_offset_s = clock_offset_s
        """Run seconds at which the previous launch's timeline ends (0 for a fresh run)."""
        self._recovered = recovered
        self._reruns = reruns
        self._dispatched = dispatched
        self._open = set(untrained)
        """Groups begun and not trained by a checkpointed step."""
        self._cursor = -(-dispatched // config.loop.group_size)
        """Groups begun, as far as `_open` has taken them in."""

    @property
    def resumed(self) -> bool:
        return self.trainer_dir is not None or bool(self._recovered or self._reruns)

    @classmethod
    async def open(
        cls,
        config: RunConfig,
        run_dir: Path,
        found: tuple[LoopState, Path] | None,
        *,
        tasks: Sequence[Task],
        resume: bool,
        heldout: Sequence[Task],
        launch: str | None = None,
    ) -> RunJournal:
        """The journal of a run starting in `run_dir` (`found`: `check_run_dir`'s checkpoint;
        `resume`: whether the folder may hold an earlier launch). On a resume it reads the ledger
        and the call log once (cutting the log's torn last frame, so new frames follow whole
        ones), drops the metrics lines of steps after the checkpoint, converts the checkpoint's
        trainer when the core has another rank count now (`checkpoint_to_load`) and records the
        launch in `launches.jsonl` (its settings: `launch_settings` of `config`, `tasks` and
        `heldout`, the held-out tasks), all before any cell or agent starts.

        Raises `RunDirError` when a ledger line names a task the data stream (`tasks`,
        `config.seed`) no longer gives its group (the suites or the seed changed since),
        `ConfigError` for a checkpoint the core cannot load (`check_trainer_checkpoint`), and
        `ValueError` when `launch` was used by an earlier start of this run."""
        G = config.loop.group_size
        state, trainer_dir = found if found is not None else (LoopState(), None)
        resume = resume and any(
            (run_dir / name).exists()
            for name in (LAUNCHES_FILE, "executions.jsonl", config.proxy.log_name, "checkpoints")
        )  # --resume on a folder without a run starts one
        launches = _read_launches(run_dir)
        if launch is None:
            launch = f"{len(launches)}{secrets.token_hex(2)}"
        if launch in {x.launch for x in launches}:
            raise ValueError(f"launch={launch!r} was already used in {str(run_dir)!r}")
        recovered: dict[tuple[int, int], Executed] = {}
        reruns: list[Rerun] = []
        dispatched = state.dispatched
        untrained = list(state.open_groups)
        offset = 0.0
        if resume and state.step < config.loop.steps:  # a finished run has nothing to rebuild
            entries = _untrained_entries(ExecutionLedger(run_dir), state, G)
            recovered = await anyio.to_thread.run_sync(
                _recover, run_dir / config.proxy.log_name, entries
            )
            finished_ks = [g * G + m + 1 for g, m in entries]
            dispatched = max([state.dispatched, *finished_ks])
            groups = -(-dispatched // G)
            untrained = sorted(
                {g for g in state.open_groups if g < groups} | set(range(state.task_cursor, groups))
            )
            flying = {_dispatch_index(eid): eid for eid in state.in_flight}
            for g in untrained:
                task = pick_tasks(tasks, g, 1, config.seed)[0]
                for m in range(G):
                    k = g * G + m
                    entry = entries.get((g, m))
                    if entry is not None and entry.task_id != task.task_id:
                        raise RunDirError(
                            f"{str(run_dir / 'executions.jsonl')!r}: group {g} member {m} ran "
                            f"task {entry.task_id!r}, but the data stream now gives "
                            f"{task.task_id!r} (tasks.suites or seed changed since): resume "
                            "with the run's own config"
                        )
                    if k >= dispatched or (g, m) in recovered:
                        continue
                    reason = (
                        "its ledger line has no closed execution in the call log"
                        if entry is not None
                        else "it had not finished when the run stopped"
                    )
                    reruns.append(
                        Rerun(
                            group=g,
                            member=m,
                            execution_id=f"x{k}-{launch}-t{g}-g{m}",
                            was=flying.get(k),
                            reason=reason,
                        )
                    )
            offset = await anyio.to_thread.run_sync(_timeline_end, run_dir)
            await anyio.to_thread.run_sync(_drop_metrics_after, run_dir, state.step)
        load_dir = None
        if trainer_dir is not None:
            load_dir = await anyio.to_thread.run_sync(checkpoint_to_load, config, trainer_dir)
        record = Launch(
            launch=launch,
            resumed_from_step=state.step if resume else None,
            version=state.version,
            dispatched=dispatched,
            recovered=sorted(ex.outcome.execution_id for ex in recovered.values()),
            rerun=reruns,
            settings=launch_settings(config, tasks, heldout),
        )
        run_dir.mkdir(parents=True, exist_ok=True)
        append_line(run_dir / LAUNCHES_FILE, msgspec.json.encode(record))
        if resume:
            logger.info(
                "resuming after step %d (version %d): %d finished executions reused, %d run "
                "again, %d groups untrained",
                state.step,
                state.version,
                len(recovered),
                len(reruns),
                len(untrained),
            )
        return cls(
            config,
            run_dir,
            state=state,
            trainer_dir=trainer_dir,
            launch=launch,
            recovered=recovered,
            reruns=reruns,
            dispatched=dispatched,
            untrained=untrained,
            clock_offset_s=offset,
            load_dir=load_dir,
        )

    # -- start ----------------------------------------------------------------------------------

    async def restore_cells(
        self, clients: Sequence[CellClient], snapshot: str, version: int
    ) -> tuple[str, int]:
        """Load the checkpoint into the cells (`clients[0]` is the core: its trainer gets the
        checkpoint's trainer state, from `load_dir`; every cell's engine gets its weights at its
        version). Returns the (snapshot, version) the runtime starts from: the checkpoint's, or
        the arguments when there is no checkpoint."""
        if self.trainer_dir is None:
            return snapshot, version
        weights = str(self.trainer_dir / WEIGHTS_DIR)
        await clients[0].load_checkpoint(str(self.load_dir))
        async with anyio.create_task_group() as tg:
            for client in clients:
                tg.start_soon(client.load_weights, weights, self.state.version)
        return weights, self.state.version

    def continue_clock(self, step_ledger: StepLedger) -> None:
        """Shift a started `StepLedger`'s clock so run seconds continue where the previous
        launch's timeline ended (its water-level times stay non-decreasing)."""
        step_ledger.t0 -= self.clock_offset_s

    async def begin(
        self,
        state: DriverState,
        *,
        tasks: Sequence[Task],
        ledger: StepLedger,
        rerun: Callable[[Group, int, str], None],
    ) -> bool:
        """Put the checkpoint's position into `state` (a run whose initial roles are set, before
        its first decision; `tasks`: its training tasks): steps done, executions dispatched and
        finished, the untrained groups with their recovered members (a complete group's batch
        built and handed to batch formation, in group order; `ledger` marks the batch in), and
        the executions to run again, each handed to `rerun(group, member, execution_id)`
        (`ElasticRuntime.rerun`). Returns whether it rebuilt anything (False: a fresh run, or
        a finished one)."""
        if not self.resumed:
            return False
        G = self.config.loop.group_size
        state.steps_done = self.state.step
        if self.state.step >= self.config.loop.steps:
            return False  # a finished run: nothing to rebuild or run again
        reruns: defaultdict[int, list[Rerun]] = defaultdict(list)
        for r in self._reruns:
            reruns[r.group].append(r)
        complete: list[Group] = []
        groups: dict[int, Group] = {}
        for g in sorted(self._open):
            task = pick_tasks(tasks, g, 1, self.config.seed)[0]
            group = groups[g] = Group(g, task, G)
            if g * G + G > self._dispatched:  # members still to dispatch: the runtime's to start
                state.batches.dispatching[g] = group
            for m in range(G):
                executed = self._recovered.get((g, m))
                if executed is not None:
                    group.members[m] = executed
                    group.left -= 1
            if group.left == 0:
                complete.append(group)
            else:  # its missing members run again, or are not dispatched yet
                assert reruns[g] or g * G + G > self._dispatched, g
        state.dispatched = self._dispatched
        state.finished = self._dispatched - len(self._reruns)
        for group in complete:
            members = [m for m in group.members if m is not None]
            group.batch = await anyio.to_thread.run_sync(
                group_batch, members, self.config, self.config.loop.batch_executions
            )
            if state.batches.complete(group, state.steps_done):
                ledger.mark_batch_in()
        for r in self._reruns:
            logger.warning(
                "group %d member %d runs again as %s (was %s): %s",
                r.group,
                r.member,
                r.execution_id,
                r.was or "unknown",
                r.reason,
            )
            rerun(groups[r.group], r.member, r.execution_id)
        self._recovered = {}  # the groups hold them now
        return True

    # -- while running --------------------------------------------------------------------------

    def finished(self, step: int, group: Group, member: int, executed: Executed) -> None:
        """Append an execution of group `group` that finished during step `step` to the ledger
        (fsynced), before its group can train."""
        self.ledger.append(
            LedgerEntry(
                step=step,
                task_id=group.task.task_id,
                slot=member,
                group=group.index,
                outcome=executed.outcome,
            )
        )

    async def checkpoint(self, state: DriverState, trained: Sequence[int]) -> Path:
        """Checkpoint the run in `state` after a step that trained the groups `trained`
        (indices): its position now, the core cell's trainer (under the core's lock) and the
        published weights; keeps the newest `loop.keep_checkpoints`. Returns the checkpoint
        folder."""
        cursor = -(-state.dispatched // self.config.loop.group_size)
        self._open |= set(range(self._cursor, cursor))
        self._cursor = cursor
        self._open -= set(trained)
        weights = state.weights
        loop_state = LoopState(
            step=state.steps_done,
            version=weights.version,
            task_cursor=cursor,
            dispatched=state.dispatched,
            open_groups=tuple(sorted(self._open)),
            in_flight=tuple(sorted(state.where)),
        )
        snapshot = Path(weights.saved())
        core = state.core

        async def save(folder: Path) -> None:
            async with core.lock:
                await core.client.save_checkpoint(str(folder / TRAINER_DIR))
            await anyio.to_thread.run_sync(_link_tree, snapshot, folder / WEIGHTS_DIR)

        return await save_checkpoint_async(
            self.run_dir, loop_state, save, keep=self.config.loop.keep_checkpoints
        )


# -- reading what a killed run left ---------------------------------------------------------------


def _untrained_entries(
    ledger: ExecutionLedger, state: LoopState, G: int
) -> dict[tuple[int, int], LedgerEntry]:
    """The ledger's entries of groups the checkpoint has not trained, by (group, member); of two
    for one member (an earlier one was run again), the later."""
    open_groups = set(state.open_groups)
    out = {}
    for e in ledger.entries():
        if e.group < 0:
            continue  # a one-cell loop's entry: not this runtime's
        if e.group < state.task_cursor and e.group not in open_groups:
            continue  # trained by a checkpointed step
        out[(e.group, e.slot)] = e
    return out


def _recover(
    log_path: Path, entries: dict[tuple[int, int], LedgerEntry]
) -> dict[tuple[int, int], Executed]:
    """The finished executions of `entries` rebuilt from the call log in one streaming pass (a
    torn last frame is cut from the file); an entry whose execution has no end record in the log
    is left out (it runs again)."""
    if not log_path.exists():
        return {}
    wanted = {e.outcome.execution_id for e in entries.values()}
    log = read_log(log_path, executions=wanted)
    if log.torn_bytes:
        logger.warning(
            "call log %s: dropping a torn last frame of %d bytes", log_path, log.torn_bytes
        )
        os.truncate(log_path, log_path.stat().st_size - log.torn_bytes)
    calls = defaultdict(list)
    for call in log.calls:
        calls[call.execution_id].append(call)
    out = {}
    for key, e in entries.items():
        summary = log.summaries.get(e.outcome.execution_id)
        if summary is not None:
            out[key] = Executed(
                outcome=e.outcome, calls=calls[e.outcome.execution_id], summary=summary
            )
    return out


def _dispatch_index(execution_id: str) -> int | None:
    """k of an execution ID `x<k>-<launch>-t<group>-g<member>` (None for another form)."""
    head = execution_id.split("-", 1)[0]
    return int(head[1:]) if head[:1] == "x" and head[1:].isdigit() else None


def _timeline_end(run_dir: Path) -> float:
    """The last time `timeline.jsonl` names (0.0 without one)."""
    if not (run_dir / TIMELINE_FILE).exists():
        return 0.0
    t = read_timeline(run_dir)
    return max([0.0, *(iv.end_s for iv in t.intervals), *t.water_t_s, *(r.t_s for r in t.roles)])


def _drop_metrics_after(run_dir: Path, step: int) -> None:
    """Rewrite `metrics.jsonl` without the records of steps after `step` (and a torn last line):
    those steps are trained again by the resumed run, which writes them anew."""
    path = run_dir / METRICS_FILE
    if not path.exists():
        return
    keep, dropped = [], 0
    for line in path.read_bytes().split(b"\n"):
        if not line.strip():
            continue
        try:
            record = msgspec.json.decode(line)
        except msgspec.DecodeError:
            dropped += 1  # only the torn last line of a kill
            continue
        if isinstance(record, dict) and record.get("step", 0) > step:
            dropped += 1
            continue
        keep.append(line)
    if dropped:
        logger.warning("%s: %d records after step %d dropped (trained again)", path, dropped, step)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(b"".join(line + b"\n" for line in keep))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


def _read_launches(run_dir: Path) -> list[Launch]:
    path = run_dir / LAUNCHES_FILE
    if not path.exists():
        return []
    decoder = msgspec.json.Decoder(Launch)
    out = []
    for line in path.read_bytes().splitlines():
        try:
            out.append(decoder.decode(line))
        except msgspec.DecodeError:
            continue  # a torn last line
    return out


def _link_tree(src: Path, dst: Path) -> None:
    """`dst` as a copy of the folder `src`, hard-linked where the filesystem allows."""

    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, dst, copy_function=link)
