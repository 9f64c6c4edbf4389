"""The cell's HTTP API: aiohttp routes and handlers over one engine and its `CellRoles`.

Owns `CellAPI` (the handlers, the cell's health and the stop event), `cell_app` (the routes,
behind the bearer-token check of `$GYRE_CELL_SECRET`) and `status_of`. Bodies are msgpack
(`cell_wire`). Errors answer with a status and a `WireError` whose code names the `gyre.errors`
class. Generate deltas go out on the client's delta stream (`cell_stream`); role switches and
training are `gyre.cell.roles`'. Knows nothing about process start-up, signals or the
command line (`gyre.cell.server`), nor about executions, chat or the node's scheduling.
"""

from __future__ import annotations

import asyncio
import hmac
from collections import Counter

import msgspec
from aiohttp import web

from gyre.cell.roles import CellRoles
from gyre.cell.stream import DeltaStreams
from gyre.cell.wire import (
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
    StreamedGenerate,
    SwitchRequest,
    TrainRequest,
    WireError,
    cell_secret,
    decode,
    encode,
)
from gyre.engines.protocol import KVTransferEngine
from gyre.errors import (
    ContextLengthError,
    EngineTimeoutError,
    EngineUnavailableError,
    GyreError,
    InvalidRequestError,
)

__all__ = ["CellAPI", "cell_app", "status_of"]

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


class CellAPI:
    """The aiohttp handlers over one engine (set once it started) and the cell's `roles`
    (trainer and gradient group, optionally)."""

    def __init__(self) -> None:
        self.engine = None
        self.health = Health(state="starting")
        self.stop = asyncio.Event()
        self._inflight: Counter[str] = Counter()  # IDs of generate requests being streamed
        self.streams = DeltaStreams()
        self._posts = [0, 0]  # `POST /generate` batches, the requests in them
        self.roles = CellRoles(self._engine, self._inflight)

    def _health(self) -> Health:
        trainer = self.roles.trainer
        return Health(
            state=self.health.state,
            error=self.health.error,
            role=self.roles.role,
            trainer_version=None if trainer is None else trainer.version,
        )

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
        """`POST /generate`: start a batch of `StreamedGenerate`, all on open streams (else none
        is started: 503). Each request's refusal (role, engine, validation) is the first and only
        frame of its tag on its stream, before any delta."""
        try:
            batch = await self._decode(request, list[StreamedGenerate])
            for item in batch:
                self.streams.check_open(item.stream)
        except GyreError as exc:
            return _error(exc)
        self._posts[0] += 1
        self._posts[1] += len(batch)
        for item in batch:
            self._start(item)
        return _ok()

    def _start(self, item: StreamedGenerate) -> None:
        req = item.request
        try:
            if self.roles.role != "rollout":
                raise EngineUnavailableError(
                    f"cell is in role {self.roles.role!r}; request {req.request_id!r} refused"
                )
            engine = self._engine()
        except GyreError as exc:
            self.streams.refuse(item.stream, item.tag, exc)
            return
        # counted, not a set: a request reusing a running (or aborted, not yet ended) one's ID
        # must not drop that one's entry when it ends, or a switch would not abort it
        self._inflight[req.request_id] += 1
        self.streams.start(
            item.stream,
            item.tag,
            req.request_id,
            engine.generate(req),  # validation errors come at its first step, as a frame
            engine.abort,
            lambda: self._ended(req.request_id),
        )

    def _ended(self, request_id: str) -> None:
        self._inflight[request_id] -= 1
        if self._inflight[request_id] <= 0:
            del self._inflight[request_id]

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

    # -- roles and training (`CellRoles`) -------------------------------------------------------

    def cell_statistics(self) -> CellStatistics:
        roles = self.roles
        trainer, group = roles.trainer, roles.group
        return CellStatistics(
            role=roles.role,
            trainer_version=None if trainer is None else trainer.version,
            has_gradients=trainer is not None and trainer.has_gradients,
            last_switch_s=roles.last_switch_s,
            group_rank=None if group is None else group.rank,
            gradients_sent=0 if group is None else group.sent,
            gradients_received=0 if group is None else group.received,
            streams_open=self.streams.open,
            stream_writes=self.streams.writes,
            stream_frames=self.streams.frames,
            generate_posts=self._posts[0],
            generate_requests=self._posts[1],
            **roles.counts,
        )

    async def cell_statistics_handler(self, request: web.Request) -> web.Response:
        return _ok(self.cell_statistics())

    async def switch(self, request: web.Request) -> web.Response:
        try:
            return _ok(await self.roles.switch(await self._decode(request, SwitchRequest)))
        except GyreError as exc:
            return _error(exc)

    async def train(self, request: web.Request) -> web.Response:
        try:
            return _ok(await self.roles.train(await self._decode(request, TrainRequest)))
        except GyreError as exc:
            return _error(exc)

    async def load_trainer_weights(self, request: web.Request) -> web.Response:
        try:
            req = await self._decode(request, LoadWeightsRequest)
            await self.roles.load_trainer_weights(req)
            return _ok()
        except GyreError as exc:
            return _error(exc)

    async def send_gradients(self, request: web.Request) -> web.Response:
        try:
            await self.roles.send_gradients(await self._decode(request, SendGradientsRequest))
            return _ok()
        except GyreError as exc:
            return _error(exc)

    async def receive_gradients(self, request: web.Request) -> web.Response:
        try:
            req = await self._decode(request, ReceiveGradientsRequest)
            await self.roles.receive_gradients(req)
            return _ok()
        except GyreError as exc:
            return _error(exc)

    async def step(self, request: web.Request) -> web.Response:
        try:
            return _ok(await self.roles.step(await self._decode(request, StepRequest)))
        except GyreError as exc:
            return _error(exc)

    async def save_checkpoint(self, request: web.Request) -> web.Response:
        try:
            await self.roles.save_checkpoint(await self._decode(request, CheckpointRequest))
            return _ok()
        except GyreError as exc:
            return _error(exc)

    async def load_checkpoint(self, request: web.Request) -> web.Response:
        try:
            await self.roles.load_checkpoint(await self._decode(request, CheckpointRequest))
            return _ok()
        except GyreError as exc:
            return _error(exc)


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


def cell_app(cell: CellAPI) -> web.Application:
    """The cell API's routes over `cell` (bearer-token checked):

    GET  /health        Health (503 while starting, 500 if the engine failed to start)
    GET  /stream?id=ID  the client's delta stream: length-prefixed FrameBatches, one per
                        engine step
    POST /generate      list[StreamedGenerate] -> {} once started (503 and none started when
                        one names a stream not open); each request's deltas, or its
                        refusal, go out on its stream
    POST /abort         AbortRequest -> list[Completion] (tokens so far)
    POST /load_weights  LoadWeightsRequest -> {} once the new version serves
    POST /export_kv     ExportKVRequest -> KVExport (503 when the engine has no KV connector)
    POST /release_kv    ReleaseKVRequest -> bool (False: already gone)
    POST /pause, /resume, /shutdown
    GET  /statistics    EngineStatistics
    GET  /cell_statistics  CellStatistics (role, trainer version, gradient traffic)
    POST /switch        SwitchRequest -> SwitchResult (to train: in-flight requests aborted,
                        engine paused, snapshot loaded into the trainer; to rollout: refused
                        while gradients are unsent, grads freed, snapshot loaded into the
                        engine)
    POST /train         TrainRequest -> AccumulateStatistics (role train only)
    POST /load_trainer_weights  LoadWeightsRequest -> {} (a satellite syncs to the core)
    POST /send_gradients        SendGradientsRequest -> {} (flat gradient to the core, then
                                zeroed)
    POST /receive_gradients     ReceiveGradientsRequest -> {} (core: received and added)
    POST /step          StepRequest -> StepResult (core: apply the step, save a snapshot)
    POST /save_checkpoint, /load_checkpoint  CheckpointRequest -> {}
    """
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
