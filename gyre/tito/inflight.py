"""One call lifecycle: every model call of an execution from its request to its record or drop.

Owns `InFlight`, the one place that moves a call through its states (`CallState`; the rule is in
docs/design.md, "One call lifecycle"): a request `begin`s (a held call of the same request is
dropped: this is its client's retry), a non-streamed call is joined by a retry (the same
`Idempotency-Key`, or else the same request) only while it is live, a call whose clients all left
is aborted (with a key, after `RETRY_GRACE_S`), and when a call leaves its flight a partial sample
is dropped if a later request of the same key began, held for `retry_window_s`, or recorded;
`end_execution` settles every call of an execution before its records are final. Also `Flight`
(one call), `Ticket`, `InFlightStatistics`, `SSEResponse` (a streamed call as server-sent events)
and `wait_disconnect`. The `Recorder` writes; this module knows nothing about rendering, OpenAI's
response format or the log's bytes.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import anyio
import msgspec
from starlette.responses import Response
from starlette.types import Receive

from gyre.errors import EngineError, ProxyError
from gyre.tito.detok import TokenText
from gyre.tito.generation import Call, engine_events
from gyre.tito.recorder import Recorder
from gyre.tito.sessions import Execution

__all__ = [
    "CallState",
    "Flight",
    "InFlight",
    "InFlightStatistics",
    "SSEResponse",
    "Ticket",
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

CallState = Literal["live", "aborted", "held", "recorded", "dropped"]
"""Where a call is in its lifecycle (docs/design.md, "One call lifecycle"): `live` (its prompt
being rendered, or the engine sampling: a non-streamed call may be joined), `aborted` (cut short:
never joined again), `held` (its partial sample waits for the client's retry), then `recorded` or
`dropped` (final)."""


async def wait_disconnect(receive: Receive) -> None:
    """Return once the ASGI server reports `http.disconnect` (call after the body was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class Ticket(NamedTuple):
    """A request that began (`InFlight.begin`)."""

    request_key: bytes
    """Digest of the request (route, role, body): a client's retry carries the same one."""
    seq: int
    """When it began, in the proxy's order of begun requests."""


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
    retries_superseded: int
    """Calls cut short whose partial sample was dropped because their client sent the same
    request again (within `retry_window_s`): the retry is the one logical call."""
    held: int
    """Calls held now for a client's retry."""


@dataclass(eq=False)
class Flight:
    """One call, streamed or not, from its request to its record (or drop)."""

    execution_id: str
    request_key: bytes | None = None
    """The request's digest (`Ticket.request_key`); None: no retry can match it."""
    seq: int = 0
    """The `Ticket.seq` of the newest request this call serves (a retry that joins it raises it);
    a later request of the same key supersedes the call's partial sample."""
    state: CallState = "live"
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    """Cancelled to abort the call (the engine request is aborted, what was sampled kept)."""
    done: anyio.Event = field(default_factory=anyio.Event)
    """Set once the call has left its scope and its partial sample, if any, was decided."""
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
    join: tuple[str, str, bytes] | None = None
    """Its key among the joinable calls (a non-streamed call, while live)."""
    deadline: float = math.inf
    """Held: when its retry window ends (the event loop's clock)."""

    def generating(self) -> bool:
        """Whether the engine may still be sampling for this call."""
        return self.call is None or any(ch.finish is None for ch in self.call.choices)


class InFlight:
    """The calls of one proxy, by execution. Not thread-safe: used from the node's event loop only.

    Args:
        recorder: writes a call's records (`Recorder.write`); drops those of a closed execution.
        retry_window_s: how long a call whose clients all left is held for their retry
            (`ProxyConfig.retry_window_s`); 0 records it at once.
    """

    def __init__(self, recorder: Recorder, *, retry_window_s: float = 0.0) -> None:
        self.recorder = recorder
        self.retry_window_s = retry_window_s
        self._flights: dict[str, set[Flight]] = {}
        """Execution -> its calls not yet out of their scope (live or aborted)."""
        self._joinable: dict[tuple[str, str, bytes], Flight] = {}
        """Live non-streamed calls, by execution and `Idempotency-Key` or request key."""
        self._replays: dict[str, OrderedDict[str, Flight]] = {}
        self._held: dict[str, list[Flight]] = {}
        """Execution -> its held calls, oldest first (so deadlines ascend)."""
        self._latest: dict[str, dict[bytes, int]] = {}
        """Execution -> request key -> `Ticket.seq` of the last request of it that began."""
        self._ending: set[str] = set()
        """Executions in `end_execution`: no request begins and no call opens any more."""
        self._begun = 0
        self.retries_joined = 0
        self.disconnect_aborts = 0
        self.close_aborts = 0
        self.retries_superseded = 0

    def statistics(self) -> InFlightStatistics:
        return InFlightStatistics(
            in_flight=sum(len(s) for s in self._flights.values()),
            retries_joined=self.retries_joined,
            disconnect_aborts=self.disconnect_aborts,
            close_aborts=self.close_aborts,
            retries_superseded=self.retries_superseded,
            held=sum(len(h) for h in self._held.values()),
        )

    # -- the lifecycle ------------------------------------------------------------------------

    def begin(self, execution: Execution, request_key: bytes) -> Ticket:
        """A request of `execution` begins (before it is rendered or joins a call): a held call of
        the same request is dropped (this is its client's retry: one logical call), and so will be
        the partial sample of one still in flight. ProxyError 409 once the execution ends."""
        self._check_open(execution)
        self._begun += 1
        eid = execution.execution_id
        self._latest.setdefault(eid, {})[request_key] = self._begun
        held = self._held.get(eid)
        if held:
            for flight in [f for f in held if f.request_key == request_key]:
                held.remove(flight)
                self._supersede(flight)
        return Ticket(request_key, self._begun)

    def open(
        self, execution: Execution, call: Call | None = None, ticket: Ticket | None = None
    ) -> Flight:
        """Register a call of `execution`; it must `leave` when it is out of its scope.
        ProxyError 409 once the execution ends."""
        self._check_open(execution)
        flight = Flight(execution_id=execution.execution_id, call=call)
        if ticket is not None:
            flight.request_key, flight.seq = ticket
        self._flights.setdefault(flight.execution_id, set()).add(flight)
        return flight

    async def leave(self, flight: Flight) -> None:
        """The call is out of its scope (its response is known): a partial sample it kept
        (`Recorder.record_partial`) is dropped when a later request of the same key began, held
        when its clients all left and a retry may come, else recorded. Shielded."""
        flights = self._flights.get(flight.execution_id)
        if flights is not None:
            flights.discard(flight)
            if not flights:
                del self._flights[flight.execution_id]
        if flight.join is not None and self._joinable.get(flight.join) is flight:
            del self._joinable[flight.join]
        call = flight.call
        with anyio.CancelScope(shield=True):
            if call is None or call.recorded or call.partial is None:
                flight.state = "recorded" if call is not None and call.recorded else "dropped"
            elif self._superseded(flight):
                self._supersede(flight)
            elif (
                flight.aborted == "disconnect"
                and flight.request_key is not None
                and self.retry_window_s > 0
                and flight.execution_id not in self._ending
            ):
                flight.state = "held"
                flight.deadline = anyio.current_time() + self.retry_window_s
                self._held.setdefault(flight.execution_id, []).append(flight)
            else:
                await self._record(flight)
        flight.done.set()

    async def end_execution(self, execution: Execution, timeout_s: float) -> int:
        """End `execution`: no request of it begins any more; its calls still generating are
        aborted, and waited for (at most `timeout_s`) until each has left; its held calls are
        recorded (no retry can come now); then the records being written end and the execution is
        closed (`Recorder.seal`): its records are final, and the same as the log holds for it.
        Returns how many calls had not left by the timeout (their records are dropped)."""
        eid = execution.execution_id
        self._ending.add(eid)
        try:
            with anyio.move_on_after(timeout_s):
                while flights := self._flights.get(eid):
                    for f in list(flights):
                        if f.state == "live" and f.generating():
                            self._abort(f, "close")
                            self.close_aborts += 1
                    await next(iter(flights)).done.wait()
            left = len(self._flights.get(eid, ()))
            with anyio.CancelScope(shield=True):
                held = self._held.pop(eid, [])
                while held:  # one at a time: the expiry may be taking from the same list
                    await self._record(held.pop(0))
                await self.recorder.seal(execution)
        finally:
            self._ending.discard(eid)
            self._replays.pop(eid, None)
            self._latest.pop(eid, None)
        return left

    async def record_expired(self) -> None:
        """Record every held call whose retry window has ended (oldest first)."""
        now = anyio.current_time()
        for eid in list(self._held):
            held = self._held.get(eid, [])
            while held and held[0].deadline <= now:
                await self._record(held.pop(0))
            if not held and self._held.get(eid) is held:
                del self._held[eid]

    async def run_expiry(self, interval_s: float = 1.0) -> None:
        """Record expired held calls every `interval_s` until cancelled; then record the rest."""
        try:
            while True:
                await anyio.sleep(interval_s)
                await self.record_expired()
        finally:
            with anyio.CancelScope(shield=True):
                for eid in list(self._held):
                    held = self._held.pop(eid, [])
                    while held:
                        await self._record(held.pop(0))

    def _check_open(self, execution: Execution) -> None:
        if execution.closed or execution.execution_id in self._ending:
            raise ProxyError(
                f"execution {execution.execution_id!r} was closed",
                status=409,
                error_code="execution_closed",
            )

    def _superseded(self, flight: Flight) -> bool:
        """Whether a request of the same key began after the newest one this call serves."""
        latest = self._latest.get(flight.execution_id, {})
        return flight.request_key is not None and latest.get(flight.request_key, 0) > flight.seq

    def _abort(self, flight: Flight, why: Literal["disconnect", "close"]) -> None:
        """Cut a live call short: it leaves the joinable calls at once and is never joined."""
        flight.state, flight.aborted = "aborted", why
        if flight.join is not None and self._joinable.get(flight.join) is flight:
            del self._joinable[flight.join]
        flight.scope.cancel()

    def _supersede(self, flight: Flight) -> None:
        """Drop a call's partial sample: its client's retry is the logical call."""
        if flight.call is not None:
            flight.call.recorded = True  # nothing records it later
        flight.state = "dropped"
        self.retries_superseded += 1

    async def _record(self, flight: Flight) -> None:
        """Write a call's partial sample (`Recorder.write` is shielded: begun, it is whole)."""
        call = flight.call
        assert call is not None and call.partial is not None  # only such calls are decided here
        await self.recorder.write(call, call.partial)
        flight.state = "recorded"

    # -- disconnects and non-streamed calls, shared by retries --------------------------------

    async def watch(self, flight: Flight, receive: Receive) -> None:
        """Wait for this waiter's client to disconnect, then leave the flight: the last waiter
        to leave aborts a call that is still generating (after `RETRY_GRACE_S` if idempotent)."""
        await wait_disconnect(receive)
        flight.waiters -= 1
        if flight.waiters == 0 and flight.idempotent and flight.generating():
            await anyio.sleep(RETRY_GRACE_S)  # a retry with the same key may join meanwhile
        if flight.waiters == 0 and flight.state == "live" and flight.generating():
            self._abort(flight, "disconnect")
            self.disconnect_aborts += 1

    async def shared(
        self,
        execution: Execution,
        ticket: Ticket,
        body: bytes,
        idempotency_key: str | None,
        receive: Receive,
        produce: Callable[[Flight], Awaitable[Response]],
        gone: Callable[[Flight], Response],
    ) -> Response:
        """The response of a non-streamed call: a retry joins the live call of the same
        `idempotency_key`, or without one of the same request (`ticket`), or, with a key, gets the
        finished call's response again; otherwise `produce(flight)` makes it. `gone(flight)` is
        the response when the call was aborted (its clients left, or its execution closed).
        Raises ProxyError 422 for a key reused with another body, 409 once the execution ends."""
        eid = execution.execution_id
        replays = self._replays.get(eid)
        if idempotency_key is not None and replays is not None and idempotency_key in replays:
            return await self._join(replays[idempotency_key], ticket, body, receive, gone)
        join = (eid, "request", ticket.request_key)
        if idempotency_key is not None:
            join = (eid, "idempotency-key", idempotency_key.encode())
        joined = self._joinable.get(join)
        if joined is not None:
            return await self._join(joined, ticket, body, receive, gone)
        flight = self.open(execution, ticket=ticket)
        flight.body, flight.idempotent, flight.join = body, idempotency_key is not None, join
        self._joinable[join] = flight
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.watch, flight, receive)
                with flight.scope:
                    flight.response = await produce(flight)
                tg.cancel_scope.cancel()
        finally:
            await self.leave(flight)
        if flight.response is None:
            return gone(flight)
        if idempotency_key is not None and flight.response.status_code == 200:
            replays = self._replays.setdefault(eid, OrderedDict())
            replay = Flight(execution_id=eid, state="recorded", response=flight.response, body=body)
            replay.done.set()  # kept without its call: the response is all a retry needs
            replays[idempotency_key] = replay
            while len(replays) > REPLAYS_PER_EXECUTION:
                replays.popitem(last=False)
        return flight.response

    async def _join(
        self,
        flight: Flight,
        ticket: Ticket,
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
            assert flight.state == "live"  # an aborted call left the joinable ones at once
            flight.seq = max(flight.seq, ticket.seq)  # it now serves the newest request
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

    The first chunk is produced before the status line is sent, so a request the engine refuses,
    or whose execution ends before its first token, still gets a plain HTTP error (`error(exc)`,
    409 `execution_closed` for the latter: as a non-streamed call does). A client
    that disconnects, before the first token or after, aborts generation; what was sampled so far
    is kept by the stream's own cleanup (`openai_format.chat_stream`) and decided when the call
    leaves `InFlight`.
    """

    def __init__(
        self,
        call: Call,
        chunks: Callable[[Any], AsyncGenerator[bytes, None]],
        *,
        text: TokenText,
        inflight: InFlight,
        ticket: Ticket,
        error: Callable[[Exception], Response],
    ) -> None:
        self.call, self.chunks, self.text = call, chunks, text
        self.inflight, self.ticket, self.error = inflight, ticket, error

    async def __call__(self, scope, receive, send) -> None:
        try:
            flight = self.inflight.open(self.call.execution, self.call, self.ticket)
        except ProxyError as exc:
            await self.error(exc)(scope, receive, send)
            return
        started = False

        async def sending(message) -> None:
            nonlocal started
            started |= message["type"] == "http.response.start"
            await send(message)

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.inflight.watch, flight, receive)
                with flight.scope:
                    await self._stream(scope, receive, sending)
                tg.cancel_scope.cancel()
        finally:
            await self.inflight.leave(flight)
        if flight.aborted == "close" and not started:  # its client still waits: a 409
            closed = ProxyError(
                "the execution was closed while this call was generating",
                status=409,
                error_code="execution_closed",
            )
            await self.error(closed)(scope, receive, send)

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
