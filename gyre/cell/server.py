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

Serving at engine speed (measured 2026-12-01, 2 cores; shared/notes/cell-serving.md): a cell in
a session of its own is a scheduling autogroup of its own, and while vLLM's queue readers spin
(`sched_yield`, 1 s after each message) the node's client got 3-4% of a CPU, so concurrent
requests reached the engine one by one (gyre/direct time 4.7 at 8, 10.2 at 32). Cells therefore
run in the node's session (`cell_process`), the client keeps no idle keep-alive connections (a
burst retried on one), and all of a client's requests share one delta stream (`cell_stream`):
one write per engine step instead of one HTTP chunk per request per step (17.8 request deltas
per write in `bench_engine` at load 11 on 2 cores). What was left (2026-12-05, a probe timing
each token): the engine stepped about 10% slower through a cell (2.17 against 1.96 ms a token at
one request), the CPU that the node and the cell spend on each step's wake-up taken from an
engine whose processes already fill both cores. So a stream write waited up to 5 ms for more
deltas (never a request's first or last; 20 ms since 2026-12-06, below): 43 request deltas a
write, the node's CPU per round of 32 x 64 tokens 0.033 -> 0.023 s, gyre/direct 1.12 / 1.13 /
1.09 -> 1.02-1.04 / 1.03-1.06 / 1.05-1.12 at 1 / 8 / 32 requests (two runs; one engine start
still moves a ratio by 30%).
Through the OpenAI proxy (probes of 2026-12-05, 32 x 64 tokens a batch, same engine start):
0.30-0.39 s a batch against vLLM's own server's 0.22-0.25 s. The node spent 0.11 s of CPU a batch
(proxy and client; vLLM's server 0.039 s, its client 0.027 s), the cell 0.081 s. Not the cause:
the client in a process of its own (no change), the 32 requests' arrival at the cell (4-8 ms
apart), the garbage collector (5 ms a batch on average; `gc.freeze` changed no median: the
full collections it prevents are rare, but each stops the loop for 0.2-0.4 s, below), the
coalescing window (20 ms: 0.340 against 0.354 s). Keeping the node, the cell and EngineCore off
the worker's core made it slower (direct engine 0.25 -> 0.32 s): the proxy's own CPU a request
is what is left.
Since 2026-12-06 (`bench_engine`, the direct path and the cell path batch by batch on one engine
start): the window is 20 ms, since at 5 ms (one engine step of 32 requests here) each request's
consumer on the node still woke every step (node CPU a batch 0.043 -> 0.019 s), and the engine
asks vLLM for flat logprobs (`vllm_params`); gyre/direct 1.04 / 1.02 / 1.01 at 1 / 8 / 32. With
the proxy in a process of its own, it spends what vLLM's API server does (0.054 against 0.052
CPU-s a batch of 32); this process between them (0.089) is what gyre's path adds: 1.32 against
vLLM's server (1.20 when both are asked for logprobs).
Later on 2026-12-06: vLLM hands each request's tokens over every 4 tokens, not every step
(`EngineConfig.stream_interval`, vLLM's own setting; the first token and the end at once), so a
request's consumer here wakes every 4th step: this process's CPU a batch of 32 fell from 0.089 to
0.057-0.067 s and the node's stayed 0.014-0.029. The start-up heap is frozen before the cell
reports ready (`gyre._heap`: a full collection walked ~383,000 import objects with the loop
stopped, 0.2-0.4 s). Three `bench_engine` runs: gyre/direct 1.01-1.04 / 1.04-1.11 / 1.03-1.07 at
1 / 8 / 32, proxy against vLLM's server 1.21 / 1.31 / 1.24 (per round 1.05-1.50: each path is its
own engine start). What is left is the proxy hop: the 32 calls of a batch reach `generate` 25-35
ms after they were sent (each costs the proxy ~1.5 ms of CPU, half of it Hypercorn, h11 and
trio), and the last response leaves 15-25 ms after the last token.
On 2026-12-07 the proxy's idle connections close after 1 s, not Hypercorn's 5 s (`gyre._asgi`):
Hypercorn kept each connection its client closed until then, a few hundred dead ones at a time
under a connection a call. Four `bench_engine` runs since: proxy against vLLM's server 1.03 / 1.13
/ 1.24 / 1.23, rounds 0.78-1.63 (median 1.17, against 1.25 before); the 1.15 goal is not met
reliably.
Those runs timed the two servers one after the other, a minute or more apart, and the machine's
speed drifted between them. Since later that day `bench_engine` times them batch by batch in
turn, the one not timed stopped (SIGSTOP), and the ratio is the median over adjacent pairs: 1.19
(rounds 1.16-1.29; with logprobs 1.17) in 5 rounds, missed. The idle-connection timer is 120 s
again, with the cause of the dead connections fixed instead (`gyre._asgi._close_on_eof`).
On 2026-12-07 (5 rounds each, one after the other): this process on uvloop, as `vllm serve` runs,
against asyncio: its CPU a batch 0.062 against 0.056 s, gyre/direct 1.03 / 1.07 / 1.03 against
1.06 / 1.02 / 0.99, proxy against vLLM's server 1.22 against 1.25, no change beyond run-to-run
spread, so the cell stays on asyncio. Two more runs of main gave 1.25 and 1.33 (rounds
1.20-1.45); vLLM's server against the cell's own engine driven directly swings 0.91-1.20 from one
engine start to the next. Against vLLM's OpenAI server built in this process on the cell's own
engine (`benchmarks.engine_host`), one engine start for both: 1.22 (rounds 1.14-1.33), 1.04 with
logprobs asked of both. The gap is the proxy's fixed cost a call and the logprob that gyre's
path computes for every call.
Agents and verifiers keep their own sessions (untrusted code gets no controlling terminal), so
each CPU-bound one weighs as much as the node and its cells together; an agent's tool commands no
longer open a session (autogroup) each.
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
