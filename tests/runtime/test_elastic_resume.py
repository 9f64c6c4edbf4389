"""The elastic runtime's journal (`gyre.runtime.elastic_resume`): what a step checkpoint holds,
what a resume recovers from the ledger and the call log, what it runs again, and a whole kill and
resume on cell doubles (no group trained twice, no member twice, no step written twice).

The plan tests build a killed run's folder by hand: a checkpoint after step 1 of a batch of 2
groups x 2 members, ledger lines of executions that finished after it, a call log whose last
frame is torn and one execution whose end record never reached the log. The expected plan is
worked out by hand in each test's comments.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import anyio
import msgspec
import pytest

from gyre.config import config_from_dict
from gyre.engines.scripted import ScriptedEngine
from gyre.errors import ConfigError, RunDirError
from gyre.model.recipe import build_tokenizer
from gyre.rollout.tasks import pick_tasks
from gyre.runtime.batch_formation import BatchFormation
from gyre.runtime.cell_handle import CellHandle
from gyre.runtime.checkpoint import (
    ExecutionLedger,
    LedgerEntry,
    LoopState,
    check_run_dir,
    latest_checkpoint,
)
from gyre.runtime.elastic_job import run_cells
from gyre.runtime.elastic_resume import (
    LAUNCHES_FILE,
    Launch,
    RunJournal,
    check_resume_config,
    launch_settings,
)
from gyre.runtime.metrics import EvalMetrics, StepMetrics, read_metrics
from gyre.runtime.timeline import TimelineWriter, read_timeline
from gyre.runtime.weight_version import WeightVersion
from gyre.tasks.outcome import Outcome, Score
from gyre.tasks.task import load_suite
from gyre.tito.log import CallLog
from gyre.tito.records import ExecutionSummary, to_reference
from tests.runtime.fake_cells import Exchange, FakeStep, FakeTrainingCell
from tests.trajectory.builders import make_call

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "examples/tasks/learnable"
AGENT = Path(__file__).with_name("coin_agent.py")
B, G = 4, 2
SEED = 1


def config(
    run_dir: Path, *, steps: int = 3, policy: str = "elastic", agent_args: tuple[str, ...] = ()
) -> object:
    return config_from_dict(
        {
            "run_dir": str(run_dir),
            "seed": SEED,
            "loop": {"steps": steps, "batch_executions": B, "group_size": G, "keep_checkpoints": 2},
            "scheduler": {"policy": policy, "capacity_per_cell": 2},
            "tasks": {
                "suites": [str(SUITE)],
                "harness": {"agent_command": ["python", str(AGENT), *agent_args]},
            },
            "router": {"no_cell_timeout_s": 60},
        }
    )


# -- a killed run's folder, by hand -----------------------------------------------------------


def task_of(tasks, group: int) -> str:
    return pick_tasks(tasks, group, 1, SEED)[0].task_id


def entry(tasks, eid: str, group: int, member: int, step: int) -> LedgerEntry:
    score = Score(passed=member, total=1, score=float(member), all_passed=bool(member))
    task = task_of(tasks, group)
    outcome = Outcome(execution_id=eid, task_id=task, termination="finished", score=score)
    return LedgerEntry(step=step, task_id=task, slot=member, group=group, outcome=outcome)


def calls_of(eid: str):
    return to_reference(
        [
            make_call(eid, f"{eid}-c0", [1, 2, 3], [4, 5], versions=[1, 1]),
            make_call(eid, f"{eid}-c1", [1, 2, 3, 4, 5, 6], [7], parent=f"{eid}-c0", versions=[1]),
        ]
    )


def summary_of(eid: str) -> ExecutionSummary:
    return ExecutionSummary(
        execution_id=eid,
        num_calls=2,
        truncated=False,
        length_calls=0,
        context_refusals=0,
        divergences=0,
        prompt_tokens=9,
        completion_tokens=3,
    )


def step_metrics(step: int) -> StepMetrics:
    counts = dict(executions=4, finished=4, partial=0, failed=0, truncated=0, model_calls=8)
    return StepMetrics(
        step=step,
        version=step,
        pass_rate=0.5,
        mean_reward=0.5,
        policy_tokens=12,
        packed_tokens=20,
        dedup_ratio=1.0,
        logprob_abs_diff_mean=0.0,
        mean_ratio=1.0,
        applied=True,
        rollout_s=1.0,
        train_s=1.0,
        sync_s=1.0,
        step_s=3.0,
        **counts,
    )


CHECKPOINT = LoopState(
    step=1,
    version=1,
    task_cursor=3,  # groups 0, 1 trained by step 1; group 2 begun
    dispatched=6,
    open_groups=(2,),
    in_flight=("x4-L-t2-g0", "x5-L-t2-g1"),
)


async def killed_run(run_dir: Path, tasks) -> None:
    """Step 1 checkpointed (groups 0 and 1); then, before the kill: x4 (group 2, member 0)
    finished, x5 (its member 1) still ran, x6 and x7 (group 3) finished, x8 (group 4, member 0)
    ran and x9 (its member 1) finished but its end record never reached the call log."""
    run_dir.mkdir(parents=True)
    (run_dir / "checkpoints" / "step-1" / "trainer").mkdir(parents=True)
    folder = run_dir / "checkpoints" / "step-1"
    (folder / "state.json").write_bytes(msgspec.json.encode(CHECKPOINT))
    (run_dir / "checkpoints" / "latest").write_text("step-1")
    ledger = ExecutionLedger(run_dir)
    for eid, g, m, step in [
        ("x0-L-t0-g0", 0, 0, 1),
        ("x1-L-t0-g1", 0, 1, 1),
        ("x2-L-t1-g0", 1, 0, 1),
        ("x3-L-t1-g1", 1, 1, 1),
        ("x4-L-t2-g0", 2, 0, 2),
        ("x6-L-t3-g0", 3, 0, 2),
        ("x7-L-t3-g1", 3, 1, 2),
        ("x9-L-t4-g1", 4, 1, 2),
    ]:
        ledger.append(entry(tasks, eid, g, m, step))
    closed = ["x4-L-t2-g0", "x6-L-t3-g0", "x7-L-t3-g1"]

    async def write() -> None:
        log = CallLog(run_dir / "calls.log")
        for eid in [*closed, "x9-L-t4-g1"]:
            for call in calls_of(eid):
                await log.append_call(call)
        for eid in closed:
            await log.append_end(summary_of(eid))
        log.close()

    await write()
    with open(run_dir / "calls.log", "ab") as f:  # the kill tore the last frame
        f.write(b"\x40\x00\x00\x00\x01\x02")
    metrics = [
        EvalMetrics(
            step=0,
            version=0,
            split="heldout",
            executions=2,
            pass_rate=0.5,
            mean_reward=0.5,
            eval_s=1.0,
        ),
        step_metrics(1),
        step_metrics(2),
    ]
    with open(run_dir / "metrics.jsonl", "wb") as f:
        f.write(b"".join(msgspec.json.encode(r) + b"\n" for r in metrics) + b'{"type": "st')
    with TimelineWriter(run_dir) as timeline:
        timeline.interval(0, 0.0, 12.5, "rollout", step=2)
        timeline.water(13.0, 3, 4)
    (run_dir / LAUNCHES_FILE).write_bytes(
        msgspec.json.encode(Launch(launch="L", resumed_from_step=None, version=0)) + b"\n"
    )


async def open_journal(run_dir: Path, tasks, **kw) -> RunJournal:
    cfg = config(run_dir)
    found = check_run_dir(run_dir, resume=True, records=("calls.log", LAUNCHES_FILE))
    return await RunJournal.open(cfg, run_dir, found, tasks=tasks, heldout=(), resume=True, **kw)


@pytest.mark.anyio
async def test_a_resume_recovers_finished_untrained_groups_and_reruns_the_rest_once(
    tmp_path: Path,
) -> None:
    tasks = load_suite(SUITE)
    run_dir = tmp_path / "run"
    await killed_run(run_dir, tasks)
    torn_size = (run_dir / "calls.log").stat().st_size
    journal = await open_journal(run_dir, tasks, launch="M")

    # groups 0 and 1 were trained by the checkpointed step: their ledger lines are left alone.
    # x4, x6, x7 finished and closed: reused. x9 finished but has no end record: run again.
    # Dispatched: x0..x9 (the highest finished is x9), so every member up to k = 9 that is not
    # reused runs again: x5 (in flight at the checkpoint), x8 (dispatched after it), x9.
    assert sorted(journal._recovered) == [(2, 0), (3, 0), (3, 1)]
    assert [(r.group, r.member, r.execution_id, r.was) for r in journal._reruns] == [
        (2, 1, "x5-M-t2-g1", "x5-L-t2-g1"),
        (4, 0, "x8-M-t4-g0", None),
        (4, 1, "x9-M-t4-g1", None),
    ]
    assert "call log" in journal._reruns[2].reason
    recovered = journal._recovered[(3, 1)]
    assert [c.call_id for c in recovered.calls] == ["x7-L-t3-g1-c0", "x7-L-t3-g1-c1"]
    assert recovered.summary.execution_id == "x7-L-t3-g1"
    # the torn frame is cut (6 bytes), so the proxy appends after whole frames
    assert (run_dir / "calls.log").stat().st_size == torn_size - 6
    # metrics: step 2 (and the torn line) dropped, it is trained again; eval 0 and step 1 kept
    assert [(type(r).__name__, r.step) for r in read_metrics(run_dir)] == [
        ("EvalMetrics", 0),
        ("StepMetrics", 1),
    ]
    assert journal.clock_offset_s == 13.0  # the timeline's last time
    launches = (run_dir / LAUNCHES_FILE).read_bytes().splitlines()
    record = msgspec.json.decode(launches[-1], type=Launch)
    assert record.launch == "M" and record.resumed_from_step == 1 and record.version == 1
    assert record.recovered == ["x4-L-t2-g0", "x6-L-t3-g0", "x7-L-t3-g1"]

    # begin: the runtime's state takes the position; group 3 is complete and goes to the batch
    spawned = []
    state = SimpleNamespace(
        steps_done=0,
        dispatched=0,
        finished=0,
        batches=BatchFormation(groups_per_batch=B // G, streaming=True),
    )
    rebuilt = await journal.begin(
        state,
        tasks=tasks,
        ledger=SimpleNamespace(mark_batch_in=lambda: None),
        rerun=lambda group, member, eid: spawned.append((group, member, eid)),
    )
    assert rebuilt
    assert (state.steps_done, state.dispatched, state.finished) == (1, 10, 7)
    assert [g.index for g in state.batches.step_groups] == [3]
    assert state.batches.step_groups[0].batch is not None
    assert [(group.index, m, eid) for group, m, eid in spawned] == [
        (2, 1, "x5-M-t2-g1"),
        (4, 0, "x8-M-t4-g0"),
        (4, 1, "x9-M-t4-g1"),
    ]
    group2 = spawned[0][0]
    assert group2.left == 1 and group2.members[0].outcome.execution_id == "x4-L-t2-g0"


@pytest.mark.anyio
async def test_a_reused_launch_id_and_a_changed_data_stream_are_refused(tmp_path: Path) -> None:
    tasks = load_suite(SUITE)
    run_dir = tmp_path / "run"
    await killed_run(run_dir, tasks)
    with pytest.raises(ValueError, match="launch='L' was already used"):
        await open_journal(run_dir, tasks, launch="L")
    other = [t for t in tasks if t.task_id != task_of(tasks, 3)]  # the stream now differs
    with pytest.raises(RunDirError, match="group [0-9]+ member [0-9]+ ran task"):
        await open_journal(run_dir, other)


@pytest.mark.anyio
async def test_a_resume_that_changes_what_the_run_trains_with_is_refused(tmp_path: Path) -> None:
    """Each start records what it trains with: the config's `RESUME_FIXED` settings and the task
    split. A `--resume` of a run that trained (it holds a checkpoint) that changes one is refused,
    naming every changed key with both values; one that changes another setting (more steps, the
    scheduler) goes on, and so does one of a run that trained nothing yet. A launch of an older
    gyre, without the record, holds a resume to nothing."""
    tasks = load_suite(SUITE)
    run_dir = tmp_path / "run"
    await killed_run(run_dir, tasks)  # a checkpoint after step 1; its launch "L" records nothing
    base = config(run_dir)
    changed = msgspec.structs.replace(
        base,
        rl=msgspec.structs.replace(base.rl, stop_penalty=0.5),
        trainer=msgspec.structs.replace(base.trainer, learning_rate=1e-3),
        scheduler=msgspec.structs.replace(base.scheduler, capacity_per_cell=3),  # not fixed
    )
    check_resume_config(run_dir, changed, tasks, (), trained=True)  # "L" holds it to nothing

    await open_journal(run_dir, tasks, launch="M")  # this start records its settings
    record = msgspec.json.decode(
        (run_dir / LAUNCHES_FILE).read_bytes().splitlines()[-1], type=Launch
    )
    assert record.settings["rl.stop_penalty"] == 0.0
    assert record.settings["loop.group_size"] == G and record.settings["seed"] == SEED
    assert record.settings["tasks"]["train"] == len(tasks) == 32
    assert record.settings["tasks"]["heldout"] == 0
    assert record.settings == launch_settings(base, tasks, ())

    check_resume_config(run_dir, base, tasks, (), trained=True)
    check_resume_config(run_dir, config(run_dir, steps=10), tasks, (), trained=True)  # extended
    check_resume_config(run_dir, changed, tasks, (), trained=False)  # nothing trained with it
    expected = (
        f"--resume of {str(run_dir)!r} with settings the run was not trained with: "
        "rl.stop_penalty = 0.5 (the run: 0.0); trainer.learning_rate = 0.001 (the run: 1e-05). "
        "Resume with the run's own values (its launches.jsonl holds them) or start a new run_dir"
    )
    with pytest.raises(ConfigError) as refused:
        check_resume_config(run_dir, changed, tasks, (), trained=True)
    assert str(refused.value) == expected
    # one task held out instead of trained: the split differs, however the suites are written
    with pytest.raises(ConfigError, match=r"tasks = \{'train': 31, 'heldout': 1, 'sha256': "):
        check_resume_config(run_dir, base, tasks[1:], tasks[:1], trained=True)
    # A launch recorded before `trainer.adam_eps` existed trained at its default (PyTorch's
    # 1e-8): a resume at another epsilon is refused, not let through for want of the key.
    lines = (run_dir / LAUNCHES_FILE).read_bytes().splitlines()
    older = msgspec.json.decode(lines[-1], type=Launch)
    del older.settings["trainer.adam_eps"]
    (run_dir / LAUNCHES_FILE).write_bytes(b"\n".join([*lines[:-1], msgspec.json.encode(older)]))
    check_resume_config(run_dir, base, tasks, (), trained=True)
    eps = msgspec.structs.replace(
        base, trainer=msgspec.structs.replace(base.trainer, adam_eps=1e-5)
    )
    with pytest.raises(ConfigError, match=r"trainer\.adam_eps = 1e-05 \(the run: 1e-08\)\. "):
        check_resume_config(run_dir, eps, tasks, (), trained=True)


class _Core:
    def __init__(self) -> None:
        self.saved: list[str] = []

    async def save_checkpoint(self, path: str) -> None:
        Path(path).mkdir(parents=True)
        (Path(path) / "model.pt").write_bytes(b"w" * 100)
        self.saved.append(path)


@pytest.mark.anyio
async def test_a_step_checkpoint_holds_the_trainer_the_weights_and_the_position(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    journal = await RunJournal.open(
        config(run_dir),
        run_dir,
        None,
        tasks=load_suite(SUITE),
        heldout=(),
        resume=False,
        launch="A",
    )
    snapshot = tmp_path / "snapshots" / "v1"
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").write_bytes(b"s" * 64)
    core = SimpleNamespace(lock=anyio.Lock(), client=_Core())
    runtime = SimpleNamespace(  # the run's `DriverState`, as far as a checkpoint reads it
        dispatched=7,  # groups 0..3 begun (group 3: member 0 only)
        steps_done=1,
        weights=WeightVersion(1, str(snapshot)),
        where={"x6-A-t3-g0": None, "x5-A-t2-g1": None},
        core=core,
    )
    folder = await journal.checkpoint(runtime, trained=[0, 2])
    state, trainer = latest_checkpoint(run_dir)
    assert trainer == folder / "trainer"
    # groups begun 0..3, trained 0 and 2 -> open 1 and 3; in flight sorted
    assert state == LoopState(
        step=1,
        version=1,
        task_cursor=4,
        dispatched=7,
        open_groups=(1, 3),
        in_flight=("x5-A-t2-g1", "x6-A-t3-g0"),
    )
    assert core.client.saved == [str(trainer / "deepspeed")]
    weights = trainer / "weights" / "model.safetensors"
    assert os.stat(weights).st_ino == os.stat(snapshot / "model.safetensors").st_ino  # a link

    # two more steps: group 1 and 3 trained, then nothing; keep_checkpoints = 2
    runtime.weights.publish(2, str(snapshot))
    runtime.steps_done, runtime.dispatched = 2, 8
    await journal.checkpoint(runtime, trained=[1, 3])
    runtime.weights.publish(3, str(snapshot))
    runtime.steps_done, runtime.dispatched = 3, 9
    await journal.checkpoint(runtime, trained=[])
    state, _ = latest_checkpoint(run_dir)
    assert (state.step, state.task_cursor, state.open_groups) == (3, 5, (4,))
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step-*")) == ["step-2", "step-3"]


# -- a whole kill and resume on cell doubles ----------------------------------------------------


class CheckpointingCell(FakeTrainingCell):
    """A cell double whose core writes its trainer's version (and steps seen) as a checkpoint,
    and whose step publishes a snapshot folder, as a real cell does."""

    async def step(self, snapshot_root):
        result = await super().step(snapshot_root)
        path = Path(result.snapshot)
        path.mkdir(parents=True, exist_ok=True)
        (path / "weights.json").write_text(json.dumps({"version": self.version}))
        return FakeStep(version=result.version, applied=True, grad_norm=1.0, snapshot=str(path))

    async def save_checkpoint(self, path):
        Path(path).mkdir(parents=True)
        (Path(path) / "trainer.json").write_text(json.dumps({"version": self.version}))

    async def load_checkpoint(self, path):
        self.version = self.trainer_version = json.loads((Path(path) / "trainer.json").read_text())[
            "version"
        ]


def make_cells(tok, n: int) -> list[CheckpointingCell]:
    exchange = Exchange()
    return [
        CheckpointingCell(
            i,
            ScriptedEngine(eos_token_id=tok.eos_token_id, vocab_size=len(tok), max_model_len=4096),
            exchange,
        )
        for i in range(n)
    ]


def key(eid: str) -> tuple[int, int]:
    """(group, member) of `x<k>-<launch>-t<group>-g<member>`."""
    group, member = eid.rsplit("-t", 1)[1].split("-g")
    return int(group), int(member)


async def launch(run_dir: Path, fakes, *, resume: bool, stop=None, agent_args=()):
    """One start of the run on `fakes`; `stop(runtime)` (polled) ends it at once, as a kill."""
    cfg = config(run_dir, agent_args=agent_args)
    tasks = load_suite(SUITE)
    found = check_run_dir(run_dir, resume=resume, records=("calls.log", LAUNCHES_FILE))
    journal = await RunJournal.open(cfg, run_dir, found, tasks=tasks, heldout=(), resume=resume)
    cells = [CellHandle(name=f"cell-{i}", client=f) for i, f in enumerate(fakes)]
    seen = {}
    async with anyio.create_task_group() as tg:

        async def killer() -> None:
            while "rt" not in seen or not stop(seen["rt"]):
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()

        if stop is not None:
            tg.start_soon(killer)
        await run_cells(
            cfg,
            cells,
            tokenizer=build_tokenizer(),
            tasks=tasks,
            snapshot="model",
            launch=journal.launch,
            journal=journal,
            on_runtime=lambda rt: seen.__setitem__("rt", rt),
        )
        tg.cancel_scope.cancel()
    return journal, seen["rt"]


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])  # slow tier: the node's backend only
async def test_a_run_stopped_mid_step_resumes_without_training_a_group_twice(
    tmp_path: Path,
) -> None:
    tok = build_tokenizer()
    run_dir = tmp_path / "run"
    ledger = ExecutionLedger(run_dir)
    first = make_cells(tok, 2)

    def mid_step_2(rt) -> bool:
        """Step 1 saved, some of step 2 finished, and an execution step 1's checkpoint holds in
        flight still running (one that finished after it is recovered, not run again: with any
        execution running, a kill once left none to rerun). Even group slots linger 1 s after
        their last call, so a group's even member outlives its odd one."""
        if rt.state.steps_done != 1 or not any(e.step == 2 for e in ledger.entries()):
            return False
        saved = latest_checkpoint(run_dir)
        return saved is not None and bool(set(saved[0].in_flight) & set(rt.state.where))

    linger = ("--linger-even", "1.0")
    j1, _ = await launch(run_dir, first, resume=False, stop=mid_step_2, agent_args=linger)
    state, trainer = latest_checkpoint(run_dir)
    assert (state.step, state.version) == (1, 1)
    assert json.loads((trainer / "deepspeed" / "trainer.json").read_text()) == {"version": 1}
    assert json.loads((trainer / "weights" / "weights.json").read_text()) == {"version": 1}
    step1 = first[0].steps[0]  # what the core's step 1 trained (independent of the journal)
    trained_1 = {key(e)[0] for e in step1}
    assert set(range(state.task_cursor)) - set(state.open_groups) == trained_1
    before = ledger.entries()
    flying = set(state.in_flight)
    assert flying and not flying & {e.outcome.execution_id for e in before if e.step == 1}

    second = make_cells(tok, 2)
    j2, rt = await launch(run_dir, second, resume=True)
    assert j2.launch != j1.launch
    assert second[0].version == 3 and rt.state.steps_done == 3
    # every surviving step: B executions of B/G whole groups; no group or member trained twice
    steps = [step1, *second[0].steps]
    assert len(steps) == 3
    groups = Counter()
    members = Counter()
    for grads in steps:
        assert sum(grads.values()) == len(grads) == B
        by_group = Counter(key(e)[0] for e in grads)
        assert sorted(by_group.values()) == [G] * (B // G)
        groups.update(by_group.keys())
        members.update(key(e) for e in grads)
    assert max(groups.values()) == 1 and max(members.values()) == 1
    # the ledger holds each trained member once; finished ones of the killed run were reused
    trained_ids = {e for grads in steps for e in grads}
    entries = ledger.entries()
    by_key = Counter(key(e.outcome.execution_id) for e in entries)
    assert all(by_key[key(e)] == 1 for e in trained_ids)
    recovered = msgspec.json.decode(
        (run_dir / LAUNCHES_FILE).read_bytes().splitlines()[-1], type=Launch
    )
    finished_open = {
        e.outcome.execution_id
        for e in before
        if e.group >= state.task_cursor or e.group in state.open_groups
    }
    assert set(recovered.recovered) == finished_open and finished_open
    assert recovered.rerun  # the kill left executions running
    # the in-flight executions of the killed run that had not finished run again, once each
    rerun_of = {r.was for r in recovered.rerun if r.was}
    assert rerun_of == flying - {e.outcome.execution_id for e in before}
    assert not flying & trained_ids - {e.outcome.execution_id for e in before}
    # metrics and the timeline continue: steps 1, 2, 3 once each; time never runs backwards
    assert [r.step for r in read_metrics(run_dir) if isinstance(r, StepMetrics)] == [1, 2, 3]
    water = read_timeline(run_dir).water_t_s
    assert list(water) == sorted(water)

    # resumed again once finished: nothing left to run, nothing written
    third = make_cells(tok, 2)
    size = (run_dir / "metrics.jsonl").stat().st_size
    _, rt3 = await launch(run_dir, third, resume=True)
    assert rt3.state.steps_done == 3 and third[0].steps == []
    last = msgspec.json.decode((run_dir / LAUNCHES_FILE).read_bytes().splitlines()[-1], type=Launch)
    assert (last.resumed_from_step, last.recovered, last.rerun) == (3, [], [])
    assert (run_dir / "metrics.jsonl").stat().st_size == size


class _TrainerWithoutGradients:
    has_gradients = False
    version = 2

    def apply_step(self):
        raise AssertionError("DeepSpeed's ZeRO step without a backward raises IndexError")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the cell's side runs on asyncio
async def test_a_step_with_nothing_trained_is_skipped_not_an_error(tmp_path: Path) -> None:
    """Every group of a step without a trainable token (all failed, or equal rewards): the core's
    step is no update (version kept, nothing published) rather than DeepSpeed's IndexError."""
    from gyre.cell.roles import CellRoles
    from gyre.cell.wire import StepRequest, StepResult

    roles = CellRoles(lambda: None, set())
    roles.trainer, roles.role = _TrainerWithoutGradients(), "train"
    result = await roles.step(StepRequest(snapshot_root=str(tmp_path)))
    assert result == StepResult(version=2, applied=False, grad_norm=None, snapshot=None)
    assert roles.counts["steps_applied"] == 0 and not any(tmp_path.iterdir())
