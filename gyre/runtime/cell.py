"""A cell worker process: one long-lived asyncio process serving an engine over a token-level API.

`python -m gyre.runtime.cell --model DIR --engine-config JSON --port-file FILE` binds an aiohttp
server first (the port goes to FILE), then starts the engine (`VLLMEngine`, or the scripted fake
when `backend = "scripted"`), and serves until `POST /shutdown` or SIGTERM:

    GET  /health        Health (503 while starting, 500 if the engine failed to start)
    POST /generate      GenerateRequest -> stream of length-prefixed Frames (deltas, or an error)
    POST /abort         AbortRequest -> list[Completion] (tokens so far)
    POST /load_weights  LoadWeightsRequest -> {} once the new version serves
    POST /export_kv     ExportKVRequest -> KVExport (503 when the engine has no KV connector)
    POST /release_kv    ReleaseKVRequest -> bool (False: already gone)
    POST /pause, /resume, /shutdown
    GET  /statistics    EngineStatistics

Bodies are msgpack (`cell_wire`). Errors answer with a status and a `WireError` whose code names
the `gyre.errors` class. Knows nothing about executions, chat or the node's scheduling.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

import msgspec
from aiohttp import web

from gyre.config import EngineConfig
from gyre.engines.protocol import GenerateRequest, KVTransferEngine
from gyre.errors import (
    ContextLengthError,
    EngineTimeoutError,
    EngineUnavailableError,
    GyreError,
    InvalidRequestError,
)
from gyre.runtime.cell_wire import (
    AbortRequest,
    ExportKVRequest,
    Frame,
    Health,
    LoadWeightsRequest,
    ReleaseKVRequest,
    WireError,
    decode,
    encode,
    encode_frame,
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
        status=status_of(exc), body=encode(WireError(code=exc.code, message=str(exc))), content_type=_MSGPACK
    )


def _ok(obj: object = None) -> web.Response:
    return web.Response(body=encode(obj if obj is not None else {}), content_type=_MSGPACK)


class _Cell:
    """The aiohttp handlers over one engine."""

    def __init__(self) -> None:
        self.engine = None
        self.health = Health(state="starting")
        self.stop = asyncio.Event()

    def _engine(self):
        if self.engine is None:
            raise EngineUnavailableError(f"cell engine is {self.health.state}: {self.health.error or ''}")
        return self.engine

    async def _decode(self, request: web.Request, type_: type):
        try:
            return decode(await request.read(), type_)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise InvalidRequestError(f"bad {type_.__name__} body: {exc}") from None

    async def health_handler(self, request: web.Request) -> web.Response:
        status = {"starting": 503, "ready": 200, "failed": 500}[self.health.state]
        return web.Response(status=status, body=encode(self.health), content_type=_MSGPACK)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            req = await self._decode(request, GenerateRequest)
            stream = self._engine().generate(req)
            first = await anext(stream)  # validation errors surface here, before any byte is sent
        except GyreError as exc:
            return _error(exc)
        response = web.StreamResponse(headers={"Content-Type": _MSGPACK})
        await response.prepare(request)
        try:
            await response.write(encode_frame(Frame(delta=first)))
            async for delta in stream:
                await response.write(encode_frame(Frame(delta=delta)))
        except GyreError as exc:
            await response.write(encode_frame(Frame(error=WireError(code=exc.code, message=str(exc)))))
        except (ConnectionResetError, asyncio.CancelledError):
            await self._engine().abort(req.request_id)  # the client went away: free the engine
            raise
        finally:
            await stream.aclose()
        await response.write_eof()
        return response

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
            raise EngineUnavailableError(f"this cell's engine ({type(engine).__name__}) cannot export KV")
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
            return web.Response(body=encode(await self._kv_engine().release_kv(req.key)), content_type=_MSGPACK)
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


async def _start_engine(model: str, config: EngineConfig):
    if config.backend == "scripted":
        from gyre.engines.scripted import ScriptedEngine

        return ScriptedEngine(max_model_len=config.max_model_len)
    from gyre.engines.vllm_engine import VLLMEngine

    return await VLLMEngine.start(model, config)


async def serve(model: str, config: EngineConfig, *, host: str, port: int, port_file: Path) -> None:
    """Serve one cell until shutdown; writes the bound port to `port_file` before starting the engine."""
    cell = _Cell()
    app = web.Application(client_max_size=256 * 2**20)
    app.router.add_get("/health", cell.health_handler)
    app.router.add_post("/generate", cell.generate)
    app.router.add_post("/abort", cell.abort)
    app.router.add_post("/load_weights", cell.load_weights)
    app.router.add_post("/export_kv", cell.export_kv)
    app.router.add_post("/release_kv", cell.release_kv)
    app.router.add_post("/pause", cell.pause)
    app.router.add_post("/resume", cell.resume)
    app.router.add_get("/statistics", cell.statistics)
    app.router.add_post("/shutdown", cell.shutdown)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(f"{bound}\n")
    os.replace(tmp, port_file)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, cell.stop.set)
    try:
        try:
            cell.engine = await _start_engine(model, config)
            cell.health = Health(state="ready")
            logger.info("cell ready on %s:%d (backend %s)", host, bound, config.backend)
        except Exception as exc:  # reported through /health; the node decides what to do
            logger.exception("engine failed to start")
            cell.health = Health(state="failed", error=f"{type(exc).__name__}: {exc}")
        await cell.stop.wait()
    finally:
        await runner.cleanup()
        if cell.engine is not None and hasattr(cell.engine, "shutdown"):
            cell.engine.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gyre.runtime.cell")
    parser.add_argument("--model", required=True, help="Hugging Face model folder")
    parser.add_argument("--engine-config", default="{}", help="EngineConfig as JSON")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", required=True, type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = msgspec.json.decode(args.engine_config.encode(), type=EngineConfig)
    asyncio.run(serve(args.model, config, host=args.host, port=args.port, port_file=args.port_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
