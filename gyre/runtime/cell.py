"""A cell worker process: one long-lived asyncio process serving an engine and a trainer.

`python -m gyre.runtime.cell --model DIR --engine-config JSON --port-file FILE` binds an aiohttp
server first (the port goes to FILE), then starts the engine (`VLLMEngine`, or the scripted fake
when `backend = "scripted"`); with `--trainer-config JSON [--rl-config JSON]` also a
`DeepSpeedTrainer` on the same model folder (its own world-size-1 DeepSpeed group), and with
`--rank I --world-size N --group-store HOST:PORT` it joins the run-wide gradient group
(`grad_group`). It serves until `POST /shutdown` or SIGTERM (during start-up SIGTERM exits at
once, with the cell's process group). The cell's role (`rollout` at start, or `train`) changes
inside the process; nothing is rebuilt for a switch:

    GET  /health        Health (503 while starting, 500 if the engine failed to start)
    GET  /stream?id=ID  the client's delta stream: length-prefixed FrameBatches, one per engine step
    POST /generate      StreamedGenerate -> {} once its first delta is on the stream (or the error)
    POST /abort         AbortRequest -> list[Completion] (tokens so far)
    POST /load_weights  LoadWeightsRequest -> {} once the new version serves
    POST /export_kv     ExportKVRequest -> KVExport (503 when the engine has no KV connector)
    POST /release_kv    ReleaseKVRequest -> bool (False: already gone)
    POST /pause, /resume, /shutdown
    GET  /statistics    EngineStatistics
    GET  /cell_statistics  CellStatistics (role, trainer version, gradient traffic)
    POST /switch        SwitchRequest -> SwitchResult (to train: in-flight requests aborted,
                        engine paused, snapshot loaded into the trainer; to rollout: refused
                        while gradients are unsent, grads freed, snapshot loaded into the engine)
    POST /train         TrainRequest -> AccumulateStatistics (role train only)
    POST /load_trainer_weights  LoadWeightsRequest -> {} (a satellite syncs to the core)
    POST /send_gradients        SendGradientsRequest -> {} (flat gradient to the core, then zeroed)
    POST /receive_gradients     ReceiveGradientsRequest -> {} (core: received and added)
    POST /step          StepRequest -> StepResult (core: apply the step, save a snapshot)
    POST /save_checkpoint, /load_checkpoint  CheckpointRequest -> {}

Torch work runs in a worker thread, one call at a time, never on the event loop.

Serving at engine speed (measured 2026-12-01, 2 cores; shared/notes/cell-serving.md): a cell in
a session of its own is a scheduling autogroup of its own, and while vLLM's queue readers spin
(`sched_yield`, 1 s after each message) the node's client got 3-4% of a CPU, so concurrent
requests reached the engine one by one (gyre/direct time 4.7 at 8, 10.2 at 32). Cells therefore
run in the node's session (`cell_process`), the client keeps no idle keep-alive connections (a
burst retried on one), and all of a client's requests share one delta stream (`cell_stream`):
one write per engine step instead of one HTTP chunk per request per step (17.8 request deltas
per write in `bench_engine` at load 11 on 2 cores). Agents and verifiers keep their own sessions
(untrusted code gets no controlling terminal), so each CPU-bound one weighs as much as the node
and its cells together; an agent's tool commands no longer open a session (autogroup) each.

Bodies are msgpack (`cell_wire`). Errors answer with a status and a `WireError` whose code names
the `gyre.errors` class. Knows nothing about executions, chat or the node's scheduling.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import logging
import os
import signal
import sys
import time
from pathlib import Path

import msgspec
from aiohttp import web

from gyre.config import EngineConfig, RLConfig, TrainerConfig
from gyre.engines.protocol import KVTransferEngine
from gyre.errors import (
    ContextLengthError,
    EngineError,
    EngineTimeoutError,
    EngineUnavailableError,
    GyreError,
    InvalidRequestError,
)
from gyre.runtime.cell_stream import DeltaStreams
from gyre.runtime.cell_wire import (
    CELL_SECRET_ENV,
    AbortRequest,
    CellStatistics,
    CheckpointRequest,
    ExportKVRequest,
    Health,
    LoadWeightsRequest,
    ReceiveGradientsRequest,
    ReleaseKVRequest,
    SendGradientsRequest,
    StepRequest,
    StepResult,
    StreamedGenerate,
    SwitchRequest,
    SwitchResult,
    TrainRequest,
    WireError,
    cell_secret,
    decode,
    encode,
)

__all__ = ["serve", "main", "status_of"]

logger = logging.getLogger(__name__)
_MSGPACK = "application/msgpack"


def status_of(exc: GyreError) -> int:
    """HTTP status for a gyre error crossing the cell API."""
    if isinstance(exc, (InvalidRequestError, ContextLengthError)):
        return 400
    if isinstance(exc, EngineUnavailableError):
        return 503
    if isinstance(exc, EngineTimeoutError):
        return 504
    return 500


def _error(exc: GyreError) -> web.Response:
    return web.Response(
        status=status_of(exc),
        body=encode(WireError(code=exc.code, message=str(exc))),
        content_type=_MSGPACK,
    )


def _ok(obj: object = None) -> web.Response:
    return web.Response(body=encode(obj if obj is not None else {}), content_type=_MSGPACK)


class _Cell:
    """The aiohttp handlers over one engine and (optionally) one trainer and gradient group."""

    def __init__(self) -> None:
        self.engine = None
        self.trainer = None  # DeepSpeedTrainer, with --trainer-config
        self.group = None  # GradientGroup, with --rank/--world-size/--group-store
        self.health = Health(state="starting")
        self.stop = asyncio.Event()
        self.role = "rollout"
        self._inflight: set[str] = set()  # generate requests being streamed
        self.streams = DeltaStreams()
        self._switch_lock = asyncio.Lock()
        self._torch_lock = asyncio.Lock()  # one trainer call at a time
        self._counts = dict(
            switches=0, requests_aborted_by_switch=0, micro_batches_trained=0, steps_applied=0
        )
        self._last_switch_s: float | None = None

    def _health(self) -> Health:
        version = None if self.trainer is None else self.trainer.version
        return Health(
            state=self.health.state,
            error=self.health.error,
            role=self.role,
            trainer_version=version,
        )

    def _need_trainer(self):
        if self.trainer is None:
            raise InvalidRequestError("this cell has no trainer (start it with --trainer-config)")
        return self.trainer

    def _need_role(self, role: str, what: str) -> None:
        if self.role != role:
            raise InvalidRequestError(
                f"{what} needs role {role!r}; the cell is in role {self.role!r}"
            )

    def _need_group(self):
        if self.group is None:
            raise InvalidRequestError(
                "this cell has no gradient group "
                "(start it with --rank, --world-size and --group-store)"
            )
        return self.group

    async def _torch(self, fn, *args):
        """Run blocking trainer work in a worker thread, one call at a time; a `ValueError` from
        the trainer is the caller's bad input."""
        async with self._torch_lock:
            try:
                return await asyncio.to_thread(fn, *args)
            except GyreError:
                raise
            except (ValueError, FileNotFoundError) as exc:
                raise InvalidRequestError(str(exc)) from None

    def _engine(self):
        if self.engine is None:
            raise EngineUnavailableError(
                f"cell engine is {self.health.state}: {self.health.error or ''}"
            )
        return self.engine

    async def _decode(self, request: web.Request, type_: type):
        try:
            return decode(await request.read(), type_)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise InvalidRequestError(f"bad {type_.__name__} body: {exc}") from None

    async def health_handler(self, request: web.Request) -> web.Response:
        status = {"starting": 503, "ready": 200, "failed": 500}[self.health.state]
        return web.Response(status=status, body=encode(self._health()), content_type=_MSGPACK)

    async def stream(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self.streams.serve(request, request.query.get("id", ""))
        except GyreError as exc:
            return _error(exc)

    async def generate(self, request: web.Request) -> web.Response:
        try:
            sreq = await self._decode(request, StreamedGenerate)
            req = sreq.request
            if self.role != "rollout":
                raise EngineUnavailableError(
                    f"cell is in role {self.role!r}; request {req.request_id!r} refused"
                )
            self.streams.check_open(sreq.stream)
            engine = self._engine()
            stream = engine.generate(req)
            self._inflight.add(req.request_id)
            try:
                first = await anext(
                    stream
                )  # validation errors surface here, before any byte is sent
                self.streams.start(
                    sreq.stream,
                    sreq.tag,
                    req.request_id,
                    stream,
                    first,
                    engine.abort,
                    lambda: self._inflight.discard(req.request_id),
                )
            except BaseException:
                self._inflight.discard(req.request_id)
                await stream.aclose()
                raise
            return _ok()
        except GyreError as exc:
            return _error(exc)

    async def abort(self, request: web.Request) -> web.Response:
        try:
            req = await self._decode(request, AbortRequest)
            return _ok(await self._engine().abort(req.request_id))
        except GyreError as exc:
            return _error(exc)

    async def load_weights(self, request: web.Request) -> web.Response:
        try:
            req = await self._decode(request, LoadWeightsRequest)
            await self._engine().load_weights(req.snapshot, req.version)
            return _ok()
        except GyreError as exc:
            return _error(exc)

    def _kv_engine(self) -> KVTransferEngine:
        engine = self._engine()
        if not isinstance(engine, KVTransferEngine):
            raise EngineUnavailableError(
                f"this cell's engine ({type(engine).__name__}) cannot export KV"
            )
        return engine

    async def export_kv(self, request: web.Request) -> web.Response:
        try:
            req = await self._decode(request, ExportKVRequest)
            return _ok(await self._kv_engine().export_kv(req.token_ids))
        except GyreError as exc:
            return _error(exc)

    async def release_kv(self, request: web.Request) -> web.Response:
        try:
            req = await self._decode(request, ReleaseKVRequest)
            return web.Response(
                body=encode(await self._kv_engine().release_kv(req.key)), content_type=_MSGPACK
            )
        except GyreError as exc:
            return _error(exc)

    async def pause(self, request: web.Request) -> web.Response:
        try:
            await self._engine().pause()
            return _ok()
        except GyreError as exc:
            return _error(exc)

    async def resume(self, request: web.Request) -> web.Response:
        try:
            await self._engine().resume()
            return _ok()
        except GyreError as exc:
            return _error(exc)

    async def statistics(self, request: web.Request) -> web.Response:
        try:
            return _ok(self._engine().statistics())
        except GyreError as exc:
            return _error(exc)

    async def shutdown(self, request: web.Request) -> web.Response:
        self.stop.set()
        return _ok()

    # -- roles and training ---------------------------------------------------------------------

    def cell_statistics(self) -> CellStatistics:
        trainer, group = self.trainer, self.group
        return CellStatistics(
            role=self.role,
            trainer_version=None if trainer is None else trainer.version,
            has_gradients=trainer is not None and trainer.has_gradients,
            last_switch_s=self._last_switch_s,
            group_rank=None if group is None else group.rank,
            gradients_sent=0 if group is None else group.sent,
            gradients_received=0 if group is None else group.received,
            streams_open=self.streams.open,
            stream_writes=self.streams.writes,
            stream_frames=self.streams.frames,
            **self._counts,
        )

    async def cell_statistics_handler(self, request: web.Request) -> web.Response:
        return _ok(self.cell_statistics())

    async def switch(self, request: web.Request) -> web.Response:
        try:
            req = await self._decode(request, SwitchRequest)
            if req.role not in ("rollout", "train"):
                raise InvalidRequestError(
                    f"role {req.role!r} is unknown: expected 'rollout' or 'train'"
                )
            engine = self._engine()
            async with self._switch_lock:
                if req.role == self.role:
                    return _ok(SwitchResult(seconds=0.0))
                start = time.perf_counter()
                if req.role == "train":
                    await self._to_train(engine, req)
                else:
                    await self._to_rollout(engine, req)
                self._last_switch_s = time.perf_counter() - start
                self._counts["switches"] += 1
                return _ok(SwitchResult(seconds=self._last_switch_s))
        except GyreError as exc:
            return _error(exc)

    async def _to_train(self, engine, req: SwitchRequest) -> None:
        trainer = self._need_trainer()
        self.role = "switching"  # new generate requests are refused from here on
        try:
            for request_id in list(
                self._inflight
            ):  # the router drained first; stragglers end as `abort`
                if await engine.abort(request_id):
                    self._counts["requests_aborted_by_switch"] += 1
            await engine.pause()
            if req.snapshot is not None:  # a satellite takes the core's weights
                await self._torch(trainer.load_weights, req.snapshot, req.version)
        except BaseException:
            await engine.resume()
            self.role = "rollout"
            raise
        self.role = "train"

    async def _to_rollout(self, engine, req: SwitchRequest) -> None:
        trainer = self._need_trainer()
        if trainer.has_gradients:
            raise InvalidRequestError(
                "switch to rollout refused: the trainer holds unsent gradients (send them, or step)"
            )
        self.role = "switching"
        try:
            await self._torch(trainer.zero_grad)  # frees the gradient memory
            if req.snapshot is not None and req.version != engine.statistics().weight_version:
                await engine.load_weights(req.snapshot, req.version)
            await engine.resume()
        except BaseException:
            self.role = "train"
            raise
        self.role = "rollout"

    async def train(self, request: web.Request) -> web.Response:
        try:
            req = await self._decode(request, TrainRequest)
            trainer = self._need_trainer()
            self._need_role("train", "/train")
            stats = await self._torch(trainer.accumulate, req.micro_batches, req.advantages)
            self._counts["micro_batches_trained"] += stats.micro_batches
            return _ok(stats)
        except GyreError as exc:
            return _error(exc)

    async def load_trainer_weights(self, request: web.Request) -> web.Response:
        try:
            req = await self._decode(request, LoadWeightsRequest)
            trainer = self._need_trainer()
            await self._torch(trainer.load_weights, req.snapshot, req.version)
            return _ok()
        except GyreError as exc:
            return _error(exc)

    async def send_gradients(self, request: web.Request) -> web.Response:
        try:
            req = await self._decode(request, SendGradientsRequest)
            trainer, group = self._need_trainer(), self._need_group()
            self._need_role("train", "/send_gradients")

            def send() -> None:
                group.send(trainer.gradient_vector(), req.dst)
                trainer.zero_grad()  # only once delivered: a failed send keeps the gradients

            await self._torch(_exchange, send, f"send of gradients to rank {req.dst}")
            return _ok()
        except GyreError as exc:
            return _error(exc)

    async def receive_gradients(self, request: web.Request) -> web.Response:
        try:
            req = await self._decode(request, ReceiveGradientsRequest)
            trainer, group = self._need_trainer(), self._need_group()
            self._need_role("train", "/receive_gradients")

            def receive() -> None:
                import torch

                vec = group.recv(
                    torch.empty(trainer.num_parameters, dtype=trainer.grad_dtype), req.src
                )
                trainer.add_gradient_vector(vec)

            await self._torch(_exchange, receive, f"receive of gradients from rank {req.src}")
            return _ok()
        except GyreError as exc:
            return _error(exc)

    async def step(self, request: web.Request) -> web.Response:
        try:
            req = await self._decode(request, StepRequest)
            trainer = self._need_trainer()
            self._need_role("train", "/step")

            def step() -> StepResult:
                stats = trainer.apply_step()
                snapshot = str(trainer.save_snapshot(req.snapshot_root)) if stats.applied else None
                return StepResult(
                    version=stats.version,
                    applied=stats.applied,
                    grad_norm=stats.grad_norm,
                    snapshot=snapshot,
                )

            result = await self._torch(step)
            self._counts["steps_applied"] += result.applied
            return _ok(result)
        except GyreError as exc:
            return _error(exc)

    async def save_checkpoint(self, request: web.Request) -> web.Response:
        try:
            req = await self._decode(request, CheckpointRequest)
            await self._torch(self._need_trainer().save_checkpoint, req.path)
            return _ok()
        except GyreError as exc:
            return _error(exc)

    async def load_checkpoint(self, request: web.Request) -> web.Response:
        try:
            req = await self._decode(request, CheckpointRequest)
            await self._torch(self._need_trainer().load_checkpoint, req.path)
            return _ok()
        except GyreError as exc:
            return _error(exc)


def _exchange(fn, what: str):
    """Run a gradient send/receive; gloo's errors (a peer that never came, or went) become
    `EngineTimeoutError` / `EngineError` naming the exchange."""
    try:
        return fn()
    except RuntimeError as exc:
        text = str(exc)
        if (
            "timed out" in text.lower() or "timeout" in text.lower()
        ):  # gloo: "Timed out waiting 20000ms ..."
            raise EngineTimeoutError(f"{what} timed out: {text[:300]}") from None
        raise EngineError(f"{what} failed: {text[:300]}") from None


async def _start_engine(model: str, config: EngineConfig):
    if config.backend == "scripted":
        from gyre.engines.scripted import ScriptedEngine

        return ScriptedEngine(max_model_len=config.max_model_len)
    from gyre.engines.vllm_engine import VLLMEngine

    return await VLLMEngine.start(model, config)


async def _start_trainer(model: str, trainer: TrainerConfig, rl: RLConfig):
    from gyre.engines.trainer import DeepSpeedTrainer
    from gyre.rl import PolicyObjective

    return await asyncio.to_thread(DeepSpeedTrainer, model, trainer, PolicyObjective(rl))


def _authorised(secret: str):
    """aiohttp middleware: 401 for a request without `Authorization: Bearer <secret>`."""
    expected = f"Bearer {secret}".encode()

    @web.middleware
    async def check(request: web.Request, handler):
        if not hmac.compare_digest(request.headers.get("Authorization", "").encode(), expected):
            return web.Response(
                status=401, text=f"cell API: missing or wrong bearer token (${CELL_SECRET_ENV})"
            )
        return await handler(request)

    return check


def _app(cell: _Cell) -> web.Application:
    """The cell API's routes over `cell` (bearer-token checked)."""
    app = web.Application(client_max_size=256 * 2**20, middlewares=[_authorised(cell_secret())])
    app.router.add_get("/health", cell.health_handler)
    app.router.add_get("/stream", cell.stream)
    app.router.add_post("/generate", cell.generate)
    app.router.add_post("/abort", cell.abort)
    app.router.add_post("/load_weights", cell.load_weights)
    app.router.add_post("/export_kv", cell.export_kv)
    app.router.add_post("/release_kv", cell.release_kv)
    app.router.add_post("/pause", cell.pause)
    app.router.add_post("/resume", cell.resume)
    app.router.add_get("/statistics", cell.statistics)
    app.router.add_post("/shutdown", cell.shutdown)
    app.router.add_get("/cell_statistics", cell.cell_statistics_handler)
    app.router.add_post("/switch", cell.switch)
    app.router.add_post("/train", cell.train)
    app.router.add_post("/load_trainer_weights", cell.load_trainer_weights)
    app.router.add_post("/send_gradients", cell.send_gradients)
    app.router.add_post("/receive_gradients", cell.receive_gradients)
    app.router.add_post("/step", cell.step)
    app.router.add_post("/save_checkpoint", cell.save_checkpoint)
    app.router.add_post("/load_checkpoint", cell.load_checkpoint)
    return app


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
) -> None:
    """Serve one cell until shutdown; writes the bound port to `port_file` before starting the
    engine, then the trainer (`trainer` given) and the gradient group (`group` = (store address,
    rank, world size)); `/health` says ready once all three are up."""
    cell = _Cell()
    app = _app(cell)
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
            cell.engine = await _start_engine(model, config)
            if trainer is not None:
                cell.trainer = await _start_trainer(model, trainer, rl or RLConfig())
            if group is not None:
                from gyre.runtime.grad_group import GradientGroup

                address, rank, world_size = group
                timeout_s = (trainer or TrainerConfig()).train_timeout_s
                cell.group = await asyncio.to_thread(
                    GradientGroup, address, rank, world_size, timeout_s=timeout_s
                )
            cell.health = Health(state="ready")
            logger.info("cell ready on %s:%d (backend %s)", host, bound, config.backend)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gyre.runtime.cell")
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
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
