"""A cell worker process: start-up, signals and the command line of one long-lived asyncio process.

`python -m gyre.cell.server --model DIR --engine-config JSON --port-file FILE` binds the cell's
aiohttp server (`gyre.cell.api`) first (the port goes to FILE), then starts the engine
(`VLLMEngine`, or the scripted fake when `backend = "scripted"`); with `--trainer-config JSON
[--rl-config JSON]` also a trainer on the same model folder: with `--devices-per-cell K` (default
1) a DeepSpeed group of K ranks, this process rank 0 and K - 1 worker processes it starts
(`gyre.cell.ranks`), and with `--rank I --world-size N --group-store HOST:PORT` (I: this
cell of N) its ranks join the run-wide gradient group (`grad_group`) as ranks I*K .. I*K + K - 1;
both held by the cell's `CellRoles` (`gyre.cell.roles`). It serves until
`POST /shutdown` or SIGTERM (during start-up SIGTERM exits at once, with the cell's process
group, the worker ranks included). Owns `serve` and `main`; knows nothing about the routes'
bodies or the roles.

The cell runs in the node's session (`gyre.cell.spawn`), so the scheduler does not starve the
node's client behind vLLM's spinning queue readers (`docs/notes/cell-serving.md`), and it
freezes its start-up heap before it reports ready (`gyre._heap`). How fast this path runs
against vLLM driven directly, run by run: `docs/notes/engine-speed.md`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec
from aiohttp import web

from gyre._heap import freeze_startup_heap, thaw_heap
from gyre.cell.api import CellAPI, cell_app
from gyre.cell.wire import CELL_SECRET_ENV, Health
from gyre.config import EngineConfig, RLConfig, TrainerConfig

__all__ = ["serve", "main"]

logger = logging.getLogger(__name__)


async def _start_engine(model: str, config: EngineConfig, devices: int):
    """The cell's engine: vLLM tensor-parallel over the cell's `devices` on GPU; on CPU one
    engine process (tensor parallelism is GPU-only here: the cell's k ranks are the trainer's)."""
    if config.backend == "scripted":
        from gyre.engines.scripted import ScriptedEngine

        return ScriptedEngine(max_model_len=config.max_model_len)
    import torch

    from gyre.engines.vllm_engine import VLLMEngine

    tensor_parallel = devices if torch.cuda.is_available() else 1
    return await VLLMEngine.start(model, config, tensor_parallel_size=tensor_parallel)


async def _start_trainer(
    model: str,
    trainer: TrainerConfig,
    rl: RLConfig,
    ranks: int,
    group: tuple[str, int, int] | None,
):
    """The cell's `CellTrainer` and its rank 0's `GradientGroup` (None without `group`)."""
    from gyre.cell.ranks import start_cell_trainer

    return await asyncio.to_thread(
        lambda: start_cell_trainer(model, trainer, rl, ranks=ranks, group=group)
    )


async def serve(
    model: str,
    config: EngineConfig,
    *,
    host: str,
    port: int,
    port_file: Path,
    trainer: TrainerConfig | None = None,
    rl: RLConfig | None = None,
    group: tuple[str, int, int] | None = None,
    devices_per_cell: int = 1,
    app_factory: Callable[[CellAPI], web.Application] = cell_app,
) -> None:
    """Serve one cell until shutdown; writes the bound port to `port_file` before starting the
    engine, then the trainer (`trainer` given; over `devices_per_cell` ranks) and the gradient
    group (`group` = (store address, this cell's index, the number of cells)); `/health` says
    ready once all three are up. `app_factory` builds the aiohttp app over the cell's `CellAPI`
    (`cell_app`; `benchmarks.engine_host` adds a route to it)."""
    cell = CellAPI()
    app = app_factory(cell)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(f"{bound}\n")
    os.replace(tmp, port_file)
    previous = signal.signal(signal.SIGTERM, _exit_while_starting)
    try:
        try:
            cell.engine = await _start_engine(model, config, devices_per_cell)
            if trainer is not None:
                cell.roles.trainer, cell.roles.group = await _start_trainer(
                    model, trainer, rl or RLConfig(), devices_per_cell, group
                )
            elif group is not None:
                from gyre.cell.grad_group import GradientGroup

                address, rank, world_size = group
                timeout_s = TrainerConfig().train_timeout_s
                cell.roles.group = await asyncio.to_thread(
                    lambda: GradientGroup(address, rank, world_size, timeout_s=timeout_s)
                )
            frozen = freeze_startup_heap()  # before /health says ready: no request waits on it
            cell.health = Health(state="ready")
            logger.info(
                "cell ready on %s:%d (backend %s; %d start-up objects frozen)",
                host,
                bound,
                config.backend,
                frozen,
            )
        except Exception as exc:  # reported through /health; the node decides what to do
            logger.exception("engine failed to start")
            cell.health = Health(state="failed", error=f"{type(exc).__name__}: {exc}")
        asyncio.get_running_loop().add_signal_handler(
            signal.SIGTERM, cell.stop.set
        )  # from now on: a clean stop
        await cell.stop.wait()
    finally:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, previous)
        cell.streams.close_all()
        await runner.cleanup()
        thaw_heap()  # so the engine's shutdown can collect what it leaves in cycles
        if cell.roles.trainer is not None:
            await asyncio.to_thread(cell.roles.trainer.close)
        if cell.engine is not None and hasattr(cell.engine, "shutdown"):
            cell.engine.shutdown()


def _exit_while_starting(signum: int, _frame) -> None:
    """SIGTERM before the cell is up: exit now. Start-up (vLLM, DeepSpeed) blocks for up to
    minutes and cannot be cancelled, and a node that died sends this (`PR_SET_PDEATHSIG`): waiting
    for the start to finish left an orphan holding its memory. A cell that leads its process group
    (as `spawn_cell` starts it) takes the group, vLLM's engine processes included, with it."""
    if os.getpgid(0) == os.getpid():
        os.killpg(0, signal.SIGKILL)
    os._exit(128 + signum)


def main(
    argv: list[str] | None = None,
    *,
    app_factory: Callable[[CellAPI], web.Application] = cell_app,
) -> int:
    """The cell process's command line (see `serve`; `app_factory` is passed on to it)."""
    parser = argparse.ArgumentParser(prog="python -m gyre.cell.server")
    parser.add_argument("--model", required=True, help="Hugging Face model folder")
    parser.add_argument("--engine-config", default="{}", help="EngineConfig as JSON")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", required=True, type=Path)
    parser.add_argument(
        "--trainer-config", default=None, help="TrainerConfig as JSON (no trainer without it)"
    )
    parser.add_argument("--rl-config", default=None, help="RLConfig as JSON")
    parser.add_argument(
        "--rank", type=int, default=None, help="rank in the run-wide gradient group"
    )
    parser.add_argument(
        "--world-size", type=int, default=None, help="size of the run-wide gradient group"
    )
    parser.add_argument(
        "--group-store", default=None, help="HOST:PORT of the node's gradient-group TCPStore"
    )
    parser.add_argument(
        "--devices-per-cell", type=int, default=1, help="ranks of the cell's trainer (K >= 1)"
    )
    args = parser.parse_args(argv)
    if not os.environ.get(CELL_SECRET_ENV):
        parser.error(
            f"${CELL_SECRET_ENV} is not set: clients authenticate with it "
            "(gyre sets it for the cells it starts)"
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = msgspec.json.decode(args.engine_config.encode(), type=EngineConfig)
    trainer = (
        None
        if args.trainer_config is None
        else msgspec.json.decode(args.trainer_config.encode(), type=TrainerConfig)
    )
    rl = (
        None
        if args.rl_config is None
        else msgspec.json.decode(args.rl_config.encode(), type=RLConfig)
    )
    group_args = (args.rank, args.world_size, args.group_store)
    if any(a is not None for a in group_args) and any(a is None for a in group_args):
        parser.error("--rank, --world-size and --group-store go together")
    if args.devices_per_cell < 1:
        parser.error(f"--devices-per-cell {args.devices_per_cell} must be >= 1")
    group = None if args.group_store is None else (args.group_store, args.rank, args.world_size)
    asyncio.run(
        serve(
            args.model,
            config,
            host=args.host,
            port=args.port,
            port_file=args.port_file,
            trainer=trainer,
            rl=rl,
            group=group,
            devices_per_cell=args.devices_per_cell,
            app_factory=app_factory,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
