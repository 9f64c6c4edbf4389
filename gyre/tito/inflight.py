"""Requests in flight: from the first token of a call to its last record, per execution.

Owns `InFlight` (every call being generated, by execution: closing an execution aborts them and
waits for their records before its end entry; a non-streamed call is shared by a client's retry,
matched by `Idempotency-Key` or else by an identical body of the same execution; the counters),
`Flight` (one call in flight), `InFlightStatistics`, `SSEResponse` (a streamed call as
server-sent events) and `wait_disconnect`. A client that disconnects aborts its engine request in
both modes, unless another client still waits for the same call (B29). Knows nothing about
rendering, OpenAI's response format or the call log.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import msgspec
from starlette.responses import Response
from starlette.types import Receive

from gyre.errors import EngineError, ProxyError
from gyre.tito.detok import TokenText
from gyre.tito.generation import Call, engine_events

__all__ = [
    "Flight",
    "InFlight",
    "InFlightStatistics",
    "SSEResponse",
    "wait_disconnect",
    "REPLAYS_PER_EXECUTION",
    "RETRY_GRACE_S",
]

REPLAYS_PER_EXECUTION = 64
"""Finished responses kept per open execution for retries that carry an `Idempotency-Key`."""
RETRY_GRACE_S = 10.0
"""A call with an `Idempotency-Key` whose clients all left keeps generating this long for the
client's retry to join (the openai SDK backs off 0.5-8 s between tries); without a key a
disconnect aborts at once (B29)."""


async def wait_disconnect(receive: Receive) -> None:
    """Return once the ASGI server reports `http.disconnect` (call after the body was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class InFlightStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of `InFlight` (docs/style.md rule 6)."""

    in_flight: int
    """Calls being generated now (streamed or not)."""
    retries_joined: int
    """Requests answered by a call already in flight (or finished, with an Idempotency-Key)."""
    disconnect_aborts: int
    """Calls aborted because every client waiting for them disconnected (both modes)."""
    close_aborts: int
    """Calls aborted because their execution was closed while they were generating."""


@dataclass(eq=False)
class Flight:
    """One call in flight, streamed or not."""

    execution_id: str
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    """Cancelled to abort the call (the engine request is aborted, what was sampled recorded)."""
    done: anyio.Event = field(default_factory=anyio.Event)
    """Set once the call has left its scope: recorded, or dropped for want of a token."""
    call: Call | None = None
    """The call once rendered (None while its prompt is being rendered)."""
    waiters: int = 1
    """Clients waiting for this call's response (the first one and the retries that joined)."""
    aborted: Literal["disconnect", "close"] | None = None
    """Why the call was cut short, if it was."""
    response: Response | None = None
    """A non-streamed call's response, shared by every waiter."""
    body: bytes = b""
    """A non-streamed call's request body (an `Idempotency-Key` must come with the same body)."""
    idempotent: bool = False
    """The call came with an `Idempotency-Key`: its client's retry may come after it left."""

    def generating(self) -> bool:
        """Whether the engine may still be sampling for this call."""
        return self.call is None or any(ch.finish is None for ch in self.call.choices)


class InFlight:
    """The calls in flight of one proxy. Not thread-safe: used from the node's event loop only."""

    def __init__(self) -> None:
        self._flights: dict[str, set[Flight]] = {}
        self._joinable: dict[tuple[str, str, bytes], Flight] = {}
        self._replays: dict[str, OrderedDict[str, Flight]] = {}
        self.retries_joined = 0
        """Requests answered by a call already in flight (or finished, with an Idempotency-Key)."""
        self.disconnect_aborts = 0
        """Calls aborted because every client waiting for them disconnected (both modes)."""
        self.close_aborts = 0
        """Calls aborted because their execution was closed while they were generating."""

    # -- every call ---------------------------------------------------------------------------

    def open(self, execution_id: str, call: Call | None = None) -> Flight:
        """Register a call of `execution_id`; `release` it when it has recorded (or dropped)."""
        flight = Flight(execution_id=execution_id, call=call)
        self._flights.setdefault(execution_id, set()).add(flight)
        return flight

    def release(self, flight: Flight) -> None:
        flights = self._flights.get(flight.execution_id)
        if flights is not None:
            flights.discard(flight)
            if not flights:
                del self._flights[flight.execution_id]
        flight.done.set()

    async def watch(self, flight: Flight, receive: Receive) -> None:
        """Wait for this waiter's client to disconnect, then leave the flight: the last waiter
        to leave aborts a call that is still generating (after `RETRY_GRACE_S` if idempotent)."""
        await wait_disconnect(receive)
        flight.waiters -= 1
        if flight.waiters == 0 and flight.idempotent and flight.generating():
            await anyio.sleep(RETRY_GRACE_S)  # a retry with the same key may join meanwhile
        if flight.waiters == 0 and flight.generating() and not flight.scope.cancel_called:
            flight.aborted = "disconnect"
            if flight.call is not None:
                flight.call.disconnected = True
            self.disconnect_aborts += 1
            flight.scope.cancel()

    async def end_execution(self, execution_id: str, timeout_s: float) -> int:
        """Abort the calls of `execution_id` still generating and wait (at most `timeout_s`) until
        every call in flight has recorded; returns how many had not by then."""
        flights = list(self._flights.get(execution_id, ()))
        for f in flights:
            if f.generating() and not f.scope.cancel_called:
                f.aborted = "close"
                self.close_aborts += 1
                f.scope.cancel()
        with anyio.move_on_after(timeout_s):
            for f in flights:
                await f.done.wait()
        self._replays.pop(execution_id, None)
        return sum(not f.done.is_set() for f in flights)

    def statistics(self) -> InFlightStatistics:
        return InFlightStatistics(
            in_flight=sum(len(s) for s in self._flights.values()),
            retries_joined=self.retries_joined,
            disconnect_aborts=self.disconnect_aborts,
            close_aborts=self.close_aborts,
        )

    # -- non-streamed calls, shared by retries ------------------------------------------------

    async def shared(
        self,
        execution_id: str,
        role: str,
        body: bytes,
        idempotency_key: str | None,
        receive: Receive,
        produce: Callable[[Flight], Awaitable[Response]],
        gone: Callable[[Flight], Response],
    ) -> Response:
        """The response of a non-streamed call: a retry joins the call already in flight (same
        `idempotency_key`, or without one the same `role` and `body`) or, with a key, gets the
        finished call's response again; otherwise `produce(flight)` makes it. `gone(flight)` is
        the response when the call was aborted (its clients left, or its execution closed).
        Raises ProxyError 422 for a key reused with another body."""
        replays = self._replays.get(execution_id)
        if idempotency_key is not None and replays is not None and idempotency_key in replays:
            return await self._join(replays[idempotency_key], body, receive, gone)
        key = (execution_id, role, body)
        if idempotency_key is not None:
            key = (execution_id, "", idempotency_key.encode())
        joined = self._joinable.get(key)
        if joined is not None:
            return await self._join(joined, body, receive, gone)
        flight = self.open(execution_id)
        flight.body, flight.idempotent = body, idempotency_key is not None
        self._joinable[key] = flight
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.watch, flight, receive)
                with flight.scope:
                    flight.response = await produce(flight)
                tg.cancel_scope.cancel()
        finally:
            del self._joinable[key]
            self.release(flight)
        if flight.response is None:
            return gone(flight)
        if idempotency_key is not None and flight.response.status_code == 200:
            replays = self._replays.setdefault(execution_id, OrderedDict())
            replay = Flight(execution_id=execution_id, response=flight.response, body=body)
            replay.done.set()  # kept without its call: the response is all a retry needs
            replays[idempotency_key] = replay
            while len(replays) > REPLAYS_PER_EXECUTION:
                replays.popitem(last=False)
        return flight.response

    async def _join(
        self,
        flight: Flight,
        body: bytes,
        receive: Receive,
        gone: Callable[[Flight], Response],
    ) -> Response:
        if flight.body != body:
            raise ProxyError(
                "this Idempotency-Key was sent before with another request body",
                status=422,
                error_code="idempotency_key_reused",
            )
        self.retries_joined += 1
        if not flight.done.is_set():
            flight.waiters += 1
            async with anyio.create_task_group() as tg:

                async def leave_on_disconnect() -> None:
                    await self.watch(flight, receive)
                    tg.cancel_scope.cancel()

                tg.start_soon(leave_on_disconnect)
                await flight.done.wait()
                tg.cancel_scope.cancel()
        r = flight.response
        if r is None:
            return gone(flight)
        return Response(r.body, status_code=r.status_code, media_type=r.media_type)


class SSEResponse:
    """A server-sent-events response that runs the engine within its own task group.

    The first chunk is produced before the status line is sent, so a request the engine refuses
    still gets a plain HTTP error (`error(exc)`). A client that disconnects, before the first
    token or after, aborts generation; what was sampled so far is recorded (finish `abort`) by the
    stream's own cleanup (`openai_format.chat_stream`), before the call leaves `InFlight`.
    """

    def __init__(
        self,
        call: Call,
        chunks: Callable[[Any], AsyncGenerator[bytes, None]],
        *,
        text: TokenText,
        inflight: InFlight,
        error: Callable[[Exception], Response],
    ) -> None:
        self.call, self.chunks, self.text = call, chunks, text
        self.inflight, self.error = inflight, error

    async def __call__(self, scope, receive, send) -> None:
        flight = self.inflight.open(self.call.execution.execution_id, self.call)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.inflight.watch, flight, receive)
                with flight.scope:
                    await self._stream(scope, receive, send)
                tg.cancel_scope.cancel()
        finally:
            self.inflight.release(flight)

    async def _stream(self, scope, receive, send) -> None:
        async with engine_events(self.call, self.text) as events:
            chunks = self.chunks(events)
            try:
                try:
                    first = await anext(chunks)
                except (ProxyError, EngineError) as exc:
                    await self.error(exc)(scope, receive, send)
                    return
                headers = [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                ]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                await send({"type": "http.response.body", "body": first, "more_body": True})
                async for chunk in chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            finally:
                with anyio.CancelScope(shield=True):
                    await chunks.aclose()
