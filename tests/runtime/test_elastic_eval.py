"""The runtime on one cell double: held-out evaluations at one published version each, the frozen
`statistics()` record, and memory bounded by the work in flight.

One `fake_cells.FakeTrainingCell` (scripted engine + a ledger trainer), the `auto` policy (so
colocate: the cell switches between rollout and training), the coin agent through the real proxy,
router and harness. The versions are read back from the call log, independently of the driver.
"""

from __future__ import annotations

import gc
from pathlib import Path

import anyio
import pytest

from gyre.config import config_from_dict
from gyre.engines.scripted import ScriptedEngine
from gyre.model.recipe import build_tokenizer
from gyre.rollout.tasks import split_tasks
from gyre.routing.continuation import MigrateContinuation, RecomputeContinuation
from gyre.runtime.batch_formation import Group
from gyre.runtime.cell_handle import CellHandle
from gyre.runtime.elastic_job import continuation_for, run_cells
from gyre.runtime.evaluation import HeldoutEvaluation, hold
from gyre.runtime.metrics import EvalMetrics, MetricsWriter, StepMetrics, read_metrics
from gyre.runtime.scheduler import Dispatch, StartStep, SwitchToRollout, SwitchToTrain
from gyre.tito.log import read_log
from tests.runtime.fake_cells import Exchange, FakeTrainingCell

REPO = Path(__file__).resolve().parents[2]
AGENT = Path(__file__).with_name("coin_agent.py")


def one_cell_config(run_dir: Path):
    return config_from_dict(
        {
            "run_dir": str(run_dir),
            "seed": 2,
            "loop": {
                "steps": 2,
                "batch_executions": 2,
                "group_size": 2,
                "heldout_tasks": 2,
                "eval_group_size": 1,
                "eval_every": 1,
            },
            "scheduler": {"capacity_per_cell": 2},
            "tasks": {
                "suites": [str(REPO / "examples/tasks/learnable")],
                "harness": {"agent_command": ["python", str(AGENT)]},
            },
            # redirects migrate KV by default (the cell doubles cannot export: recompute is the
            # fallback)
            "router": {"no_cell_timeout_s": 60, "abort_timeout_s": 10},
        }
    )


def test_one_cell_evaluates_at_one_version_each_and_releases_trained_groups(tmp_path: Path):
    run_dir = tmp_path / "run"
    cfg = one_cell_config(run_dir)
    tok = build_tokenizer()
    engine = ScriptedEngine(eos_token_id=tok.eos_token_id, vocab_size=len(tok), max_model_len=4096)
    fake = FakeTrainingCell(0, engine, Exchange())
    train, heldout = split_tasks(cfg)

    async def main():
        return await run_cells(
            cfg,
            [CellHandle(name="cell-0", client=fake)],
            tokenizer=tok,
            tasks=train,
            heldout=heldout,
            snapshot="model",
            launch="L",
        )

    runtime = anyio.run(main, backend="trio")
    assert runtime.policy.name == "colocate"  # `auto` on one cell
    continuation = runtime.router.continuation
    assert isinstance(continuation, MigrateContinuation) and continuation.export_timeout_s == 5.0
    records = read_metrics(run_dir)
    kinds = [(type(r).__name__, r.step, r.version) for r in records]
    # before the first step, after each step (eval_every = 1); the last one once
    assert kinds == [
        ("EvalMetrics", 0, 0),
        ("StepMetrics", 1, 1),
        ("EvalMetrics", 1, 1),
        ("StepMetrics", 2, 2),
        ("EvalMetrics", 2, 2),
    ]
    evals = [r for r in records if isinstance(r, EvalMetrics)]
    assert all(e.executions == 2 and e.split == "heldout" for e in evals)
    # the coin agent solves its task in odd slots; one execution per held-out task is slot 0
    assert all(e.pass_rate == 0.0 for e in evals)
    steps = [r for r in records if isinstance(r, StepMetrics)]
    assert all(s.executions == 2 and s.applied and s.pass_rate == 0.5 for s in steps)

    # every token of an evaluation was sampled by the version it is recorded at: no step
    # published while its executions ran
    log = read_log(run_dir / "calls.log")
    held = {t.task_id for t in heldout}
    for step in (0, 1, 2):
        ids = [e for e in log.summaries if e.startswith(f"eval{step}-L-")]
        assert len(ids) == 2
        versions = {v for e in ids for c in log.for_execution(e) for v in c.versions}
        assert versions == {step}, (step, versions)
    trained = {eid for grads in fake.steps for eid in grads}
    assert len(trained) == 4 and not any(e.startswith("eval") for e in trained)
    assert held  # the split held some tasks out
    # one cell: rollout -> train -> rollout per step (the last switch back for the evaluation)
    assert fake.switches == ["train", "rollout", "train", "rollout"]

    stats = runtime.statistics()
    assert (stats.steps_done, stats.weight_version, stats.roles) == (2, 2, ("rollout",))
    assert (stats.cells_rollout, stats.cells_train, stats.cells_dead) == (1, 0, 0)
    assert stats.switches == 4 == runtime.state.switches_done
    assert stats.switch_s_total == pytest.approx(sum(runtime.state.switch_s))
    assert (stats.suspensions, stats.evaluating, stats.eval_executions) == (0, False, 0)
    assert stats.water_level == stats.dispatched - stats.finished
    assert stats.rollout_capacity == 2
    # memory: only the groups the driver still holds are alive; the 2 trained ones are gone
    gc.collect()
    alive = [o for o in gc.get_objects() if isinstance(o, Group)]
    assert len(alive) == stats.groups_held < stats.dispatched // 2


def test_evaluation_schedule_and_what_a_resumed_run_skips(tmp_path: Path) -> None:
    cfg = one_cell_config(tmp_path / "run")
    _, heldout = split_tasks(cfg)
    every2 = HeldoutEvaluation(
        heldout, group_size=3, every=2, steps=5, launch="L", run_dir=tmp_path / "run"
    )
    assert [s for s in range(7) if every2.due(s)] == [0, 2, 4, 5]
    ends = HeldoutEvaluation(heldout, group_size=1, every=0, steps=3, launch="L", run_dir=tmp_path)
    assert [s for s in range(5) if ends.due(s)] == [0, 3]
    none = HeldoutEvaluation((), group_size=1, every=1, steps=3, launch="L", run_dir=tmp_path)
    assert not any(none.due(s) for s in range(5))
    jobs = every2.jobs(4)
    assert [eid for _, eid in jobs] == [f"eval4-L-t{i}-g{j}" for i in range(2) for j in range(3)]
    assert [t.task_id for t, _ in jobs] == [t.task_id for t in heldout for _ in range(3)]
    # an evaluation already in metrics.jsonl (a resumed run) is not due again
    record = every2.record(2, 2, [], 1.5)
    MetricsWriter(tmp_path / "run").write(record)
    assert [s for s in range(7) if every2.due(s)] == [0, 4, 5]
    with pytest.raises(ValueError, match="group_size=0"):
        HeldoutEvaluation(heldout, group_size=0, every=0, steps=1, launch="L", run_dir=tmp_path)


def test_hold_keeps_the_step_and_the_last_rollout_cell_for_an_evaluation() -> None:
    acts = (StartStep(), Dispatch(3), SwitchToTrain(0), SwitchToTrain(1))
    assert hold(acts, evaluation=False, over=False, rollout_cells=2) == acts
    # both rollout cells leaving would strand the evaluation: no switch, no step
    assert hold(acts, evaluation=True, over=False, rollout_cells=2) == (Dispatch(3),)
    # one of three leaving leaves two for it
    one = (SwitchToTrain(2), SwitchToRollout(1), StartStep())
    assert hold(one, evaluation=True, over=False, rollout_cells=3) == one[:2]
    # the run's steps are done: no new training execution, no step
    assert hold(acts, evaluation=False, over=True, rollout_cells=2) == acts[2:]


def test_redirects_migrate_kv_by_default_and_recompute_without_a_connector(tmp_path: Path) -> None:
    config = config_from_dict({"run_dir": str(tmp_path)})
    assert config.engine.kv_transfer.connector == "example"
    assert continuation_for(config).export_timeout_s == 15.0  # router.abort_timeout_s 30 / 2
    nixl = config_from_dict(
        {"run_dir": str(tmp_path), "engine": {"kv_transfer": {"connector": "nixl"}}}
    )
    assert isinstance(continuation_for(nixl), MigrateContinuation)
    opted_out = config_from_dict(
        {"run_dir": str(tmp_path), "engine": {"kv_transfer": {"connector": "none"}}}
    )
    assert isinstance(continuation_for(opted_out), RecomputeContinuation)
