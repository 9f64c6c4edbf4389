"""The RL job, for every cell count: start the cells, wire the run around an `ElasticRuntime`,
drive it.

Owns `run_cells` (given open cells: the TITO proxy over a `Router` of them, the router's
continuation for redirected requests (`continuation_for`: KV migration when
`[engine.kv_transfer]` names a connector, recompute otherwise), the harness, the timeline and
metrics files in `run_dir`, and the driver with the configured policy, `auto` resolved by the
cell count) and `run_elastic` (starts `cells.num_cells` cell processes, and with `[cluster]
workers` takes the worker hosts' cells too, `gyre.cell.join`; then `run_cells` on the
training and held-out tasks; the run's KV folder, `open_kv_folder`, lives as long as its cells).
Knows nothing about how the driver moves cells (`gyre.runtime.elastic`) or what a cell runs
inside (`gyre.cell.server`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import msgspec

from gyre._heap import freeze_startup_heap, thaw_heap
from gyre.cell.join import JoinServer, open_join_server
from gyre.cell.spawn import open_cells
from gyre.config import RunConfig
from gyre.engines.kv_transport import open_kv_folder
from gyre.rollout.sources import open_rollout
from gyre.rollout.tasks import split_tasks
from gyre.routing.continuation import Continuation, MigrateContinuation, RecomputeContinuation
from gyre.routing.router import Router
from gyre.runtime.cell_handle import CellHandle
from gyre.runtime.checkpoint import check_run_dir
from gyre.runtime.elastic import ElasticRuntime
from gyre.runtime.elastic_resume import LAUNCHES_FILE, RunJournal
from gyre.runtime.metrics import MetricsWriter
from gyre.runtime.progress import Progress
from gyre.runtime.scheduler import SchedulerPolicy, make_policy
from gyre.runtime.sinks import open_sinks
from gyre.runtime.timeline import TimelineWriter
from gyre.tasks.task import Task

__all__ = ["run_cells", "run_elastic", "continuation_for", "scheduler_policy"]


def continuation_for(config: RunConfig) -> Continuation:
    """How the router continues a request redirected off a cell (`gyre.routing.continuation`):
    `MigrateContinuation` (the KV cache moves, recompute as its fallback) when
    `engine.kv_transfer.connector` is not `none`, else `RecomputeContinuation`. The export's
    timeout is half `router.abort_timeout_s` (a drain waits for it)."""
    if config.engine.kv_transfer.connector == "none":
        return RecomputeContinuation()
    return MigrateContinuation(export_timeout_s=min(20.0, config.router.abort_timeout_s / 2))


def scheduler_policy(config: RunConfig, num_cells: int) -> SchedulerPolicy:
    """The policy `[scheduler]` configures for a run of `num_cells` cells in all
    (`SchedulerConfig.policy_for`; `colocate` gets `colocate_max_staleness_steps`, the others
    `max_staleness_steps`). Raises `ConfigError` as `policy_for` does."""
    sched = config.scheduler
    name = sched.policy_for(num_cells)
    return make_policy(
        name,
        max_staleness_steps=sched.colocate_max_staleness_steps
        if name == "colocate"
        else sched.max_staleness_steps,
        async_train_cells=sched.async_train_cells,
    )


async def run_cells(
    config: RunConfig,
    cells: Sequence[CellHandle],
    *,
    tokenizer: Any,
    tasks: Sequence[Task],
    snapshot: str,
    heldout: Sequence[Task] = (),
    version: int = 0,
    policy: SchedulerPolicy | None = None,
    launch: str = "0",
    on_runtime: Callable[[ElasticRuntime], None] | None = None,
    progress: Progress | None = None,
    journal: RunJournal | None = None,
) -> ElasticRuntime:
    """Run `config.loop.steps` steps on `cells` (open clients; `cells[0]` is the core): the TITO
    proxy over a `Router` of the cells (its continuation: `continuation_for`), the harness, and an
    `ElasticRuntime` with `policy` (default: `config.scheduler`'s, `policy_for(len(cells))`),
    evaluating `heldout` as `config.loop` says. Metrics and the timeline go to `config.run_dir`;
    `on_runtime` sees the runtime before it runs (the live run page's feed); `progress` (a
    `gyre.runtime.progress.Progress`) shows each step and evaluation. Returns the runtime (its
    `records`, `statistics()`, ...). With a `journal` the run keeps its ledger and a checkpoint
    per step, and a resumed one first loads its checkpoint into the cells. Raises `ConfigError`
    from `SchedulerConfig.policy_for` before anything starts."""
    run_dir = Path(config.run_dir).resolve()
    if policy is None:
        policy = scheduler_policy(config, len(cells))
    if journal is not None:  # a resumed run's weights, in the core's trainer and every engine
        snapshot, version = await journal.restore_cells(
            [c.client for c in cells], snapshot, version
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    routed = {c.name: c.client for c in cells}
    continuation = continuation_for(config)
    async with Router(routed, config=config.router, continuation=continuation) as router:
        async with open_rollout(
            config,
            tokenizer=tokenizer,
            engine_for=router.engine_for,
            max_concurrent=config.loop.max_concurrent_executions,
        ) as rollout:
            metrics = MetricsWriter(run_dir, open_sinks(config, run_dir))
            with TimelineWriter(run_dir) as timeline, metrics:
                runtime = ElasticRuntime(
                    config=config,
                    cells=cells,
                    router=router,
                    rollout=rollout,
                    policy=policy,
                    tasks=tasks,
                    heldout=heldout,
                    snapshot=snapshot,
                    version=version,
                    timeline=timeline,
                    metrics=metrics,
                    progress=progress,
                    launch=launch,
                    journal=journal,
                )
                if on_runtime is not None:
                    on_runtime(runtime)
                await runtime.run(config.loop.steps)
    return runtime


async def run_elastic(
    config: RunConfig,
    model_dir: Path,
    *,
    policy: SchedulerPolicy | None = None,
    launch: str | None = None,
    on_runtime: Callable[[ElasticRuntime], None] | None = None,
    progress: Progress | None = None,
    resume: bool = False,
) -> ElasticRuntime:
    """The RL job: start `config.cells.num_cells` cells (each a vLLM engine and a DeepSpeed
    trainer on `model_dir`, one run-wide gradient group; with `cluster.workers`, the head of
    several hosts: the workers' cells join the group and are driven as local ones), then
    `run_cells` on the training and held-out tasks (`split_tasks`), with a `RunJournal` (the
    ledger, a checkpoint per step). The `example` KV connector's folder, unless
    `engine.kv_transfer.shared_dir` names one, is the run's own (`open_kv_folder`; in /dev/shm,
    under `run_dir` with worker hosts, which see it at the same path): made before any cell starts
    (the config the cells, the workers and `run_cells` see names it) and removed when the run
    ends, on an error too. `resume=True` continues the run in `run_dir` from its newest
    checkpoint and ledger (`gyre.runtime.elastic_resume`); `launch` (default: drawn) must not be
    one an earlier start of the run used. Raises `ConfigError` when `run_dir` already holds a run
    and `resume` is False, `RunDirError` for a checkpoint or ledger that cannot be used."""
    from transformers import AutoTokenizer

    run_dir = Path(config.run_dir).resolve()
    train, heldout = split_tasks(config)
    found = check_run_dir(run_dir, resume=resume, records=(config.proxy.log_name, LAUNCHES_FILE))
    journal = await RunJournal.open(
        config, run_dir, found, tasks=train, heldout=heldout, resume=resume, launch=launch
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    async with AsyncExitStack() as stack:
        # removed after the cells stop; cells on several hosts share it where they share run_dir
        kv_parent = run_dir if config.cluster.workers else None
        engine = stack.enter_context(open_kv_folder(config.engine, kv_parent))
        config = msgspec.structs.replace(config, engine=engine)
        joins = None
        if config.cluster.workers:  # the head of several hosts: workers offer their cells
            joins = await stack.enter_async_context(open_join_server(config, model_dir))
        clients = await stack.enter_async_context(
            open_cells(
                config.cells.num_cells,
                model_dir,
                config.engine,
                log_dir=run_dir / "cells",
                trainer_config=config.trainer,
                rl_config=config.rl,
                host=config.cells.host,
                world_size=config.cells.num_cells * (config.cluster.workers + 1),
                store_host=config.cluster.host if joins else None,
                store_port=config.cluster.store_port if joins else 0,
                remote=None if joins is None else _offered(joins),
                devices_per_cell=config.cells.devices_per_cell,
            )
        )
        cells = [
            CellHandle(name=f"cell-{i}", client=c, process=c.process) for i, c in enumerate(clients)
        ]
        freeze_startup_heap()  # the node's start-up heap: no full collection walks it again
        try:
            return await run_cells(
                config,
                cells,
                tokenizer=tokenizer,
                tasks=train,
                heldout=heldout,
                snapshot=str(model_dir),
                policy=policy,
                launch=journal.launch,
                on_runtime=on_runtime,
                progress=progress,
                journal=journal,
            )
        finally:
            thaw_heap()  # `gyre.run()` may be called in a process that goes on


def _offered(joins: JoinServer):
    """`open_cells`'s `remote`: announce the store to joining workers, then wait for their cells."""

    async def remote(store: str):
        joins.set_store(store)
        return await joins.wait_offers()

    return remote
