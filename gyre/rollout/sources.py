"""Which source a run's executions come from: `open_rollout` starts the run's TITO proxy and
puts the harness (`gyre.rollout.harness`) or, with `[gateway] enabled`, the gateway
(`gyre.rollout.gateway`) behind it. Knows nothing about either source's inside, nor about
cells or training: the engine a call goes to is the caller's `engine_for`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from gyre.agents.harness import Harness
from gyre.config import RunConfig
from gyre.engines.protocol import InferenceEngine
from gyre.rollout.gateway_api import open_gateway
from gyre.rollout.harness import Rollout, with_interpreter
from gyre.rollout.source import RolloutSource
from gyre.tito.proxy import TitoProxy

__all__ = ["open_rollout"]


@asynccontextmanager
async def open_rollout(
    config: RunConfig,
    *,
    tokenizer: Any,
    engine_for: Callable[[str], InferenceEngine],
    max_concurrent: int,
) -> AsyncIterator[RolloutSource]:
    """The run's TITO proxy served on a task of its own (call log at `<run_dir>/<proxy.log_name>`),
    the harness pointed at it, and a `Rollout` over both; the proxy stops on exit. With
    `[gateway] enabled`, an `ExternalRollout` (`gyre.rollout.gateway`) instead of the harness:
    its execution API is served too and its address written to `<run_dir>/gateway.json`."""
    run_dir = Path(config.run_dir).resolve()  # agents run in their workspaces: no relative paths
    proxy = TitoProxy(
        tokenizer=tokenizer,
        engine_for=engine_for,
        config=config.proxy,
        log_path=str(run_dir / config.proxy.log_name),
    )
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.serve)
        if config.gateway.enabled:
            async with open_gateway(
                config,
                proxy,
                base_url=f"http://{config.proxy.host}:{port}/v1",
                max_concurrent=max_concurrent,
            ) as rollout:
                yield rollout
            tg.cancel_scope.cancel()
            return
        harness = Harness.from_config(
            with_interpreter(config.tasks.harness),
            base_url=f"http://{config.proxy.host}:{port}/v1",
            model=config.proxy.model_name,
            run_dir=run_dir,
        )
        for suite in config.tasks.suites:  # no agent reads another suite's hidden tests either
            harness.hide_suite(Path(suite).resolve())
        yield Rollout(
            proxy,
            harness,
            max_concurrent=max_concurrent,
            max_consecutive_failures=config.loop.max_consecutive_failures,
        )
        tg.cancel_scope.cancel()
