"""The multi-cell job: start the cells, wire the run around an `ElasticRuntime`, drive it.

Owns `run_cells` (given open cells: the TITO proxy over a `Router` of them, the harness, the
timeline and metrics files in `run_dir`, and the driver with the configured policy) and
`run_elastic` (starts `cells.num_cells` cell processes, and with `[cluster] workers` takes the
worker hosts' cells too, `gyre.runtime.join`; then `run_cells` on the training tasks).
Knows nothing about how the driver moves cells (`gyre.runtime.elastic`) or what a cell runs
inside (`gyre.runtime.cell`).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from gyre.config import RunConfig
from gyre.runtime.cell_client import open_cells
from gyre.runtime.cell_handle import CellHandle
from gyre.runtime.checkpoint import check_run_dir
from gyre.runtime.elastic import ElasticRuntime
from gyre.runtime.join import JoinServer, open_join_server
from gyre.runtime.loop import split_tasks
from gyre.runtime.metrics import MetricsWriter
from gyre.runtime.rollout import open_rollout
from gyre.runtime.router import Router
from gyre.runtime.scheduler import SchedulerPolicy, make_policy
from gyre.runtime.sinks import open_sinks
from gyre.runtime.timeline import TimelineWriter
from gyre.tasks.task import Task

__all__ = ["run_cells", "run_elastic"]


async def run_cells(
    config: RunConfig,
    cells: Sequence[CellHandle],
    *,
    tokenizer: Any,
    tasks: Sequence[Task],
    snapshot: str,
    version: int = 0,
    policy: SchedulerPolicy | None = None,
    launch: str = "0",
    on_runtime: Callable[[ElasticRuntime], None] | None = None,
) -> ElasticRuntime:
    """Run `config.loop.steps` steps on `cells` (open clients; `cells[0]` is the core): the TITO
    proxy over a `Router` of the cells, the harness, and an `ElasticRuntime` with `policy` (default:
    `config.scheduler`'s). Metrics and the timeline go to `config.run_dir`; `on_runtime` sees the
    runtime before it runs (the live run page's feed). Returns the runtime (its `records`, ...)."""
    run_dir = Path(config.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    sched = config.scheduler
    if policy is None:
        policy = make_policy(
            sched.policy,
            max_staleness_steps=sched.max_staleness_steps,
            async_train_cells=sched.async_train_cells,
        )
    async with Router({c.name: c.client for c in cells}, config=config.router) as router:
        async with open_rollout(
            config,
            tokenizer=tokenizer,
            engine_for=router.engine_for,
            max_concurrent=sched.capacity_per_cell * len(cells),
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
                    snapshot=snapshot,
                    version=version,
                    timeline=timeline,
                    metrics=metrics,
                    launch=launch,
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
) -> ElasticRuntime:
    """The multi-cell job: start `config.cells.num_cells` cells (each a vLLM engine and a DeepSpeed
    trainer on `model_dir`, one run-wide gradient group; with `cluster.workers`, the head of
    several hosts: the workers' cells join the group and are driven as local ones), then
    `run_cells` on the training tasks.
    Raises `ConfigError` when `run_dir` already holds a run (multi-cell runs do not resume yet)."""
    from transformers import AutoTokenizer

    run_dir = Path(config.run_dir).resolve()
    train, _heldout = split_tasks(config)
    check_run_dir(run_dir, resume=False, resumable=False, records=(config.proxy.log_name,))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    async with AsyncExitStack() as stack:
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
            )
        )
        cells = [
            CellHandle(name=f"cell-{i}", client=c, process=c.process) for i, c in enumerate(clients)
        ]
        return await run_cells(
            config,
            cells,
            tokenizer=tokenizer,
            tasks=train,
            snapshot=str(model_dir),
            policy=policy,
            launch=launch or secrets.token_hex(3),
            on_runtime=on_runtime,
        )


def _offered(joins: JoinServer):
    """`open_cells`'s `remote`: announce the store to joining workers, then wait for their cells."""

    async def remote(store: str):
        joins.set_store(store)
        return await joins.wait_offers()

    return remote
