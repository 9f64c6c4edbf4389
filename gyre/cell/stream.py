"""The cell's end of the delta stream: one long-lived response per client carries all its requests.

Owns `DeltaStreams`. A client opens `GET /stream?id=<id>` once and keeps it; each `POST /generate`
(a batch of `StreamedGenerate`: every request the client queued meanwhile) is answered `{}` once
its requests started, and from then on each request's frames go out on that client's stream
tagged with the client's tag: its deltas, or the error that refused or ended it (a validation
error is its first and only frame, so the client sees it before any delta). Each write is one
`FrameBatch`: every delta that became ready within `_COALESCE_S` (20 ms, several engine steps) for
all the client's requests, so those steps cost one write, one syscall and one client wake-up, not
one per request and step; a request's first delta and the end of a choice are written at once.
A stream that breaks aborts its requests in the engine.

Where a cell's main process spends its CPU: `docs/notes/engine-speed.md`. Knows nothing about
routes, roles or the engine behind `generate`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from gyre.cell.wire import Frame, FrameBatch, WireError, encode_frame
from gyre.engines.protocol import TokenDelta
from gyre.errors import EngineError, EngineUnavailableError, GyreError, InvalidRequestError

__all__ = ["DeltaStreams"]

_COALESCE_S = 0.02
"""Longest a ready frame waits for the next ones before it is written, seconds; a request's first
frame and a frame that ends a choice or a request go out at once. See `_write_until_closed`.
20 ms wakes each request's consumer on the node every few engine steps, not every step, and a
streaming client gets its tokens in 20-ms chunks (time to first token and to the end unchanged);
measured against 5 and 50 ms in `docs/notes/engine-speed.md`."""

_IDLE_CHECK_S = 5.0
"""Seconds between checks that the client of an idle stream is still connected (a stream with
requests finds out at its next write)."""


class _Stream:
    """One client's stream: frames waiting for the next write, and the requests feeding it."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.ready = asyncio.Event()
        self.urgent = asyncio.Event()
        """A queued frame starts a request or ends a choice or a request (or the stream closes):
        write now."""
        self.pumps: dict[int, asyncio.Task] = {}
        self.closed = False

    def put(self, frame: Frame, *, urgent: bool = False) -> None:
        if not self.closed:
            self.frames.append(frame)
            self.ready.set()
            if urgent or frame.delta is None or frame.delta.finish_reason is not None:
                self.urgent.set()


class DeltaStreams:
    """The open delta streams of one cell, by client stream ID."""

    def __init__(self) -> None:
        self._streams: dict[str, _Stream] = {}
        self.writes = 0
        """`FrameBatch` writes since start."""
        self.frames = 0
        """Frames in those writes."""
        self.lost = 0
        """Streams whose client went away (their requests were aborted)."""

    @property
    def open(self) -> int:
        return len(self._streams)

    async def serve(self, request: web.Request, stream_id: str) -> web.StreamResponse:
        """Serve stream `stream_id` until the client goes away or `close_all`; then cancel its
        requests (each aborts itself in the engine)."""
        if not stream_id or stream_id in self._streams:
            raise InvalidRequestError(f"stream id {stream_id!r} is empty or already open")
        stream = self._streams[stream_id] = _Stream()
        try:
            response = web.StreamResponse(headers={"Content-Type": "application/msgpack"})
            await response.prepare(request)
            try:
                await self._write_until_closed(request, stream, response)
                await response.write_eof()
            except ConnectionResetError:
                self.lost += 1  # the client went away: `finally` aborts its requests
            return response
        finally:
            del self._streams[stream_id]
            stream.closed = True
            pumps = list(stream.pumps.values())
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)

    async def _write_until_closed(
        self, request: web.Request, stream: _Stream, response: web.StreamResponse
    ) -> None:
        while not stream.closed:
            if not stream.ready.is_set():  # a timeout scope, not `wait_for` (a task per wait)
                try:
                    async with asyncio.timeout(_IDLE_CHECK_S):
                        await stream.ready.wait()
                except TimeoutError:
                    if request.transport is None or request.transport.is_closing():
                        raise ConnectionResetError("the client closed its delta stream") from None
                    continue
            # Wait up to _COALESCE_S for more frames unless one is urgent: a client's next wake-up
            # then takes several engine steps' deltas at once (they merge per choice), so the node
            # and this process spend their CPU per write, not per engine step, while a first
            # token and an ending never wait (time to first token and to the end are unchanged).
            if not stream.urgent.is_set():
                try:
                    async with asyncio.timeout(_COALESCE_S):
                        await stream.urgent.wait()
                except TimeoutError:
                    pass
            # Requests woken by one engine step queue their deltas over several loop turns: write
            # once they stop coming, so the step goes out as one batch.
            queued = -1
            while queued != len(stream.frames):
                queued = len(stream.frames)
                await asyncio.sleep(0)
            stream.ready.clear()
            stream.urgent.clear()
            batch, stream.frames = stream.frames, []
            if batch:
                await response.write(encode_frame(FrameBatch(batch)))
                self.writes += 1
                self.frames += len(batch)

    def check_open(self, stream_id: str) -> None:
        """Raise `EngineUnavailableError` unless stream `stream_id` is open."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.closed:
            raise EngineUnavailableError(
                f"no open delta stream {stream_id!r} (open GET /stream first)"
            )

    def start(
        self,
        stream_id: str,
        tag: int,
        request_id: str,
        deltas: AsyncIterator[TokenDelta],
        abort: Callable[[str], Awaitable[object]],
        done: Callable[[], None],
    ) -> None:
        """Stream `deltas` on `stream_id` as request `tag` (an error it raises, a validation
        error at its first step included, as the request's last frame).
        `abort(request_id)` frees the engine when the stream goes away first; `done()` runs when
        the request has ended either way. Raises `EngineUnavailableError` if the stream is not
        open."""
        self.check_open(stream_id)
        stream = self._streams[stream_id]
        stream.pumps[tag] = asyncio.create_task(
            _pump(stream, tag, request_id, deltas, abort, done),
            name=f"stream {stream_id} {request_id}",
        )

    def refuse(self, stream_id: str, tag: int, error: GyreError) -> None:
        """Answer request `tag` on `stream_id` with `error` as its only frame. Raises
        `EngineUnavailableError` if the stream is not open."""
        self.check_open(stream_id)
        error_frame = Frame(error=WireError(code=error.code, message=str(error)), tag=tag)
        self._streams[stream_id].put(error_frame)

    def close_all(self) -> None:
        """End every stream (cell shutdown); their requests are cancelled and aborted."""
        for stream in self._streams.values():
            stream.closed = True
            stream.ready.set()
            stream.urgent.set()


async def _pump(stream: _Stream, tag: int, request_id: str, deltas, abort, done) -> None:
    try:
        first = True
        async for delta in deltas:
            stream.put(Frame(delta=delta, tag=tag), urgent=first)
            first = False
    except GyreError as exc:
        stream.put(Frame(error=WireError(code=exc.code, message=str(exc)), tag=tag))
    except asyncio.CancelledError:
        await abort(request_id)  # the client went away: free the engine
        raise
    except Exception as exc:  # a bug below the engine protocol: the client still gets an answer
        err = EngineError(f"cell failed streaming request {request_id!r}: {exc!r}")
        stream.put(Frame(error=WireError(code=err.code, message=str(err)), tag=tag))
    finally:
        try:
            await deltas.aclose()
        finally:
            stream.pumps.pop(tag, None)
            done()
