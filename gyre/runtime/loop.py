"""The RL loop of one node (synchronous colocate schedule): roll out, score, train, publish.

Owns `run_rl`. Each step launches `batch_executions` executions (`group_size` per task) of the
agent through the TITO proxy and the harness, turns their exact model calls into trajectory trees,
selects (Jmax), packs and trains one DeepSpeed step on them, then publishes the new weights to the
vLLM cell (snapshot -> `reload_weights` -> prefix-cache reset, version + 1). Every finished
execution is in the ledger before the step trains and every step ends in a checkpoint, so a killed
run resumes (`resume=True`) without losing a completed execution or training one twice. Held-out
tasks are evaluated before the first and after the last step. Variants live in the pieces it
calls; the elastic runtime turns this schedule into cells. Knows no HTTP, tokens or losses itself.
"""

from __future__ import annotations

import logging
import math
import os
import random
import secrets
import time
from collections.abc import Sequence
from pathlib import Path

import anyio

from gyre.config import RunConfig
from gyre.errors import ConfigError
from gyre.runtime.batch import build_training_batch
from gyre.runtime.cell_client import CellClient, open_cell
from gyre.runtime.checkpoint import (
    ExecutionLedger,
    LedgerEntry,
    LoopState,
    check_run_dir,
    save_checkpoint,
)
from gyre.runtime.metrics import EvalMetrics, MetricsWriter, StepMetrics, read_metrics
from gyre.runtime.rollout import Executed, Rollout, open_rollout
from gyre.runtime.sinks import open_sinks
from gyre.tasks.task import Task, load_suite
from gyre.tito.log import LogContents, read_log

__all__ = ["run_rl", "split_tasks", "pick_tasks", "pass_rate", "evaluated", "resume_log"]

logger = logging.getLogger(__name__)


def split_tasks(config: RunConfig) -> tuple[list[Task], list[Task]]:
    """(training tasks, held-out tasks): every task of the configured suites, by task id;
    `heldout_tasks` of them, drawn by a fixed seed (the same split for every run seed), are held
    out. Raises `ConfigError` when no training task is left."""
    tasks = sorted(
        (t for suite in config.tasks.suites for t in load_suite(suite)), key=lambda t: t.task_id
    )
    k = config.loop.heldout_tasks
    held = set(random.Random("gyre-heldout").sample(range(len(tasks)), min(k, len(tasks))))
    train = [t for i, t in enumerate(tasks) if i not in held]
    heldout = [t for i, t in enumerate(tasks) if i in held]
    if not train:
        raise ConfigError(
            f"loop.heldout_tasks={k} leaves no training task among {len(tasks)} "
            f"in {config.tasks.suites}"
        )
    return train, heldout


def pick_tasks(train: Sequence[Task], cursor: int, n: int, seed: int) -> list[Task]:
    """Tasks `cursor .. cursor + n - 1` of the data stream: each epoch a seeded shuffle of
    `train`."""
    out = []
    for k in range(cursor, cursor + n):
        epoch, i = divmod(k, len(train))
        out.append(train[random.Random(f"{seed}:{epoch}").sample(range(len(train)), len(train))[i]])
    return out


def pass_rate(executed: Sequence[Executed]) -> tuple[float, float]:
    """(fraction of scored executions whose hidden tests all passed, their mean score); failed
    executions are left out; (NaN, NaN) when none was scored."""
    scored = [ex.outcome.score for ex in executed if not ex.outcome.failed]
    if not scored:
        return math.nan, math.nan
    return sum(s.all_passed for s in scored) / len(scored), sum(s.score for s in scored) / len(
        scored
    )


class _Run:
    """The state one `run_rl` call threads through its steps."""

    def __init__(
        self,
        config: RunConfig,
        trainer,
        engine: CellClient,
        rollout: Rollout,
        launch: str,
        resumed: tuple[int, LogContents] | None = None,
    ) -> None:
        self.config = config
        self.resumed = resumed
        """(step, its executions' calls) read by the start's one pass over the call log."""
        self.run_dir = Path(config.run_dir).resolve()
        self.trainer = trainer
        self.engine = engine
        self.rollout = rollout
        self.launch = launch  # part of every execution id: a restarted run never reuses one
        self.metrics = MetricsWriter(self.run_dir, open_sinks(config, self.run_dir))
        self.ledger = ExecutionLedger(self.run_dir)
        self.train_tasks, self.heldout = split_tasks(config)

    def _recovered(self, step: int) -> dict[tuple[str, int], Executed]:
        """Executions of `step` that finished before a kill, rebuilt from the ledger and call
        log."""
        entries = self.ledger.entries(step)
        if not entries:
            return {}
        if self.resumed is not None and self.resumed[0] == step:
            log, self.resumed = self.resumed[1], None  # the start read it: no second pass
        else:
            wanted = {e.outcome.execution_id for e in entries}
            log = read_log(self.run_dir / self.config.proxy.log_name, executions=wanted)
        out = {}
        for e in entries:
            summary = log.summaries.get(e.outcome.execution_id)
            if summary is not None:  # closed in the proxy: every call of it is in the log
                out[(e.task_id, e.slot)] = Executed(
                    outcome=e.outcome,
                    calls=log.for_execution(e.outcome.execution_id),
                    summary=summary,
                )
        return out

    async def step(self, state: LoopState) -> LoopState:
        cfg = self.config.loop
        step = state.step + 1
        n_tasks = cfg.batch_executions // cfg.group_size
        tasks = pick_tasks(self.train_tasks, state.task_cursor, n_tasks, self.config.seed)
        t0 = time.perf_counter()
        done = self._recovered(step)
        slots = [
            (i, task, j)
            for i, task in enumerate(tasks)
            for j in range(cfg.group_size)
            if (task.task_id, j) not in done
        ]
        jobs = [(task, f"s{step}-{self.launch}-t{i}-g{j}") for i, task, j in slots]

        def persist(k: int, ex: Executed) -> None:
            i, task, j = slots[k]
            done[(task.task_id, j)] = ex
            self.ledger.append(
                LedgerEntry(step=step, task_id=task.task_id, slot=j, outcome=ex.outcome)
            )

        await self.rollout.run_many(jobs, on_done=persist)
        groups = [[done[(task.task_id, j)] for j in range(cfg.group_size)] for task in tasks]
        executed = [ex for g in groups for ex in g]
        rollout_s = time.perf_counter() - t0

        t1 = time.perf_counter()
        batch = build_training_batch(groups, trajectory=self.config.trajectory)
        stats = None
        if batch is not None:
            stats = await anyio.to_thread.run_sync(
                self.trainer.train_batch, batch.micro_batches, batch.advantages
            )
        train_s = time.perf_counter() - t1

        t2 = time.perf_counter()
        if stats is not None and stats.applied:
            snapshot = await anyio.to_thread.run_sync(
                self.trainer.save_snapshot, self.run_dir / "snapshots"
            )
            await self.engine.load_weights(str(snapshot), self.trainer.version)
        new_state = LoopState(
            step=step, version=self.trainer.version, task_cursor=state.task_cursor + n_tasks
        )
        await anyio.to_thread.run_sync(
            lambda: save_checkpoint(
                self.run_dir, new_state, self.trainer.save_checkpoint, keep=cfg.keep_checkpoints
            )
        )
        sync_s = time.perf_counter() - t2

        rate, mean_reward = pass_rate(executed)
        statistics = await self._statistics() if self.metrics.sinks else None
        self.metrics.write(
            StepMetrics(
                step=step,
                version=self.trainer.version,
                executions=len(executed),
                pass_rate=rate,
                mean_reward=mean_reward,
                finished=sum(ex.outcome.termination == "finished" for ex in executed),
                partial=sum(ex.outcome.stopped for ex in executed),
                failed=sum(ex.outcome.failed for ex in executed),
                truncated=sum(ex.summary.truncated for ex in executed),
                model_calls=sum(len(ex.calls) for ex in executed),
                branches=sum(t.branches for t in batch.trees.values()) if batch else 0,
                heals=sum(bool(c.heals) for ex in executed for c in ex.calls),
                policy_tokens=batch.policy_tokens if batch else 0,
                packed_tokens=batch.packed_tokens if batch else 0,
                dedup_ratio=batch.linear_tokens / batch.packed_tokens if batch else math.nan,
                logprob_abs_diff_mean=stats.logprob_abs_diff_mean if stats else math.nan,
                mean_ratio=stats.mean_ratio if stats else math.nan,
                same_version_mismatch_mean=stats.same_version_abs_diff_mean if stats else math.nan,
                stale_mismatch_mean=stats.stale_abs_diff_mean if stats else math.nan,
                applied=bool(stats and stats.applied),
                rollout_s=rollout_s,
                train_s=train_s,
                sync_s=sync_s,
                step_s=time.perf_counter() - t0,
            ),
            statistics,
        )
        return new_state

    async def _statistics(self) -> dict[str, object]:
        """The `statistics()` records the metric sinks stream at each step (`sinks`)."""
        return {
            "engine": await self.engine.refresh_statistics(),
            "proxy": self.rollout.proxy.statistics(),
            "harness": self.rollout.statistics(),
            "trainer": self.trainer.statistics(),
        }

    async def evaluate(self, step: int) -> EvalMetrics | None:
        """Run the held-out tasks (`eval_group_size` executions each) at the current weights."""
        if not self.heldout:
            return None
        t0 = time.perf_counter()
        jobs = [
            (task, f"eval{step}-{self.launch}-t{i}-g{j}")
            for i, task in enumerate(self.heldout)
            for j in range(self.config.loop.eval_group_size)
        ]
        executed = await self.rollout.run_many(jobs)
        rate, mean_reward = pass_rate(executed)
        record = EvalMetrics(
            step=step,
            version=self.trainer.version,
            split="heldout",
            executions=len(executed),
            pass_rate=rate,
            mean_reward=mean_reward,
            eval_s=time.perf_counter() - t0,
        )
        self.metrics.write(record)
        return record

    def evaluated(self, step: int) -> bool:
        return evaluated(self.run_dir, step)


def evaluated(run_dir: Path, step: int) -> bool:
    """Whether `<run_dir>/metrics.jsonl` holds an evaluation at `step` (False when the file is
    missing). Raises `RunDirError` for a corrupt line (`read_metrics`)."""
    try:
        return any(isinstance(r, EvalMetrics) and r.step == step for r in read_metrics(run_dir))
    except FileNotFoundError:
        return False


def resume_log(path: Path, ledger: ExecutionLedger, step: int) -> LogContents | None:
    """The one streaming pass a (re)start makes over the call log: cut a torn last frame (a kill
    mid-write) so new frames append after whole ones, and keep the calls and summaries of the
    executions `ledger` recorded for `step` (the step a resumed run continues; memory O(their
    tokens)). None when there is no log. Raises `LogCorruptError` for a corrupt frame before
    the end."""
    if not path.exists():
        return None
    wanted = {e.outcome.execution_id for e in ledger.entries(step)}
    log = read_log(path, executions=wanted)
    if log.torn_bytes:
        logger.warning("call log %s: dropping a torn last frame of %d bytes", path, log.torn_bytes)
        os.truncate(path, path.stat().st_size - log.torn_bytes)
    return log


async def run_rl(
    config: RunConfig, model_dir: Path, *, resume: bool = False, progress=None
) -> LoopState:
    """Run the RL loop to `config.loop.steps` steps; returns the final `LoopState`.

    `resume=True` continues from the newest checkpoint of `config.run_dir` (a fresh start if it
    has none). Raises `ConfigError` when `run_dir` already holds a run and `resume` is False.
    """
    from transformers import AutoTokenizer

    from gyre.engines.trainer import DeepSpeedTrainer
    from gyre.rl import PolicyObjective

    run_dir = Path(config.run_dir).resolve()  # agents run in their workspaces: no relative paths
    split_tasks(config)  # a task folder that fails validation stops the run before anything starts
    found = check_run_dir(run_dir, resume=resume, records=(config.proxy.log_name,))
    state, trainer_dir = found if found is not None else (LoopState(), None)
    run_dir.mkdir(parents=True, exist_ok=True)
    log = resume_log(run_dir / config.proxy.log_name, ExecutionLedger(run_dir), state.step + 1)
    resumed = None if log is None else (state.step + 1, log)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    objective = PolicyObjective(config.rl)
    trainer = await anyio.to_thread.run_sync(
        lambda: DeepSpeedTrainer(model_dir, config.trainer, objective)
    )
    if trainer_dir is not None:
        await anyio.to_thread.run_sync(trainer.load_checkpoint, trainer_dir)
    weights = model_dir
    if trainer.version:
        weights = await anyio.to_thread.run_sync(trainer.save_snapshot, run_dir / "snapshots")
    async with open_cell(
        weights, config.engine, log_path=run_dir / "cells" / "cell-0.log"
    ) as engine:
        if trainer.version:
            await engine.load_weights(str(weights), trainer.version)  # tag the resumed version
        async with open_rollout(
            config,
            tokenizer=tokenizer,
            engine_for=lambda _execution: engine,
            max_concurrent=config.loop.max_concurrent_executions,
        ) as rollout:
            run = _Run(
                config, trainer, engine, rollout, launch=secrets.token_hex(3), resumed=resumed
            )
            try:
                state = await _run_steps(run, state, progress)
            finally:
                run.metrics.close()
    return state


async def _run_steps(run: _Run, state: LoopState, progress) -> LoopState:
    """Evaluate (step 0), train to `loop.steps` steps with the configured evaluations, evaluate
    the last step; returns the final `LoopState`."""
    config, run_dir = run.config, run.run_dir

    async def evaluate(step: int) -> None:
        record = await run.evaluate(step)
        if record is not None and progress is not None:
            progress.eval(record)

    if state.step == 0 and not run.evaluated(0):
        await evaluate(0)
    while state.step < config.loop.steps:
        state = await run.step(state)
        if progress is not None:
            progress.step(read_metrics(run_dir)[-1])
        every = config.loop.eval_every
        if every and state.step % every == 0 and state.step < config.loop.steps:
            await evaluate(state.step)
    if not run.evaluated(state.step):
        await evaluate(state.step)
    return state
