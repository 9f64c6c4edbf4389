"""The node's end of a cell's delta stream: `DeltaInbox` (per request) and `Outbox` (per client).

`Outbox` queues the generate requests a client has yet to post; its poster takes every request
queued at each wake-up and posts them in one `POST /generate` (the requests that arrive while it
is in flight wait for the next), so a burst of requests costs one HTTP exchange, not one each
(each was a TCP connection: httpx keeps none alive, see `CellClient`). `CellClient`'s stream
reader puts each `Frame` of a request (or the error that lost the stream) in its inbox without a
checkpoint; the request's `generate` takes every frame queued at each wake-up and hands its deltas
on merged (`cell_wire.merge_deltas`: one delta per choice, never across a finish), so a consumer
slower than the engine costs one task hop per wake-up, not one per engine step. Both queue in a
`gyre._mailbox.Mailbox`, not an anyio memory stream (a task record on every blocking `receive`;
its cost: `docs/notes/engine-speed.md`). Request deadlines
are kept by one task per client (`expire_inboxes`), not a cancel scope per wait (12-15 us each, one
per request and engine step). Knows nothing about HTTP or what the frames carry beyond `Frame`.
"""

from __future__ import annotations

import time

import anyio

from gyre._mailbox import Mailbox
from gyre.cell.wire import Frame, StreamedGenerate, merge_deltas
from gyre.engines.protocol import TokenDelta
from gyre.errors import EngineUnavailableError, GyreError, error_from_code

__all__ = ["DeltaInbox", "Outbox", "expire_inboxes"]


class DeltaInbox:
    """The frames of one request not yet taken by its consumer (a `Mailbox`) and its `deadline`
    (`time.monotonic()` seconds)."""

    __slots__ = ("deadline", "_frames")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self._frames: Mailbox[Frame | GyreError] = Mailbox()

    def put(self, frame: Frame | GyreError) -> None:
        """Queue `frame` (a `GyreError`: the stream was lost) and wake the consumer; never
        blocks."""
        self._frames.put(frame)

    def wake(self) -> None:
        """Wake the consumer if it waits (`expire_inboxes` at the deadline)."""
        self._frames.wake()

    async def wait_deltas(self, request_id: str) -> tuple[list[TokenDelta], GyreError | None]:
        """Wait until a frame is queued, then take every frame queued: the deltas before the first
        error frame, merged per choice (`merge_deltas`), and that error (None if none; frames
        after it are dropped). A lost stream's error becomes `EngineUnavailableError` naming
        `request_id`. Raises `TimeoutError` once `deadline` has passed, even with frames queued;
        a consumer waiting then is woken by `expire_inboxes`."""
        if time.monotonic() < self.deadline:
            await self._frames.wait()
        if time.monotonic() >= self.deadline:
            raise TimeoutError
        deltas: list[TokenDelta] = []
        for frame in self._frames.take():
            if isinstance(frame, GyreError):
                return merge_deltas(deltas), EngineUnavailableError(
                    f"{frame} (request {request_id!r})"
                )
            if frame.error is not None:
                return merge_deltas(deltas), error_from_code(frame.error.code, frame.error.message)
            if frame.delta is None:  # a `Frame` holds a delta or an error
                raise ValueError(f"a frame of request {request_id!r} holds no delta and no error")
            deltas.append(frame.delta)
        return merge_deltas(deltas), None


class Outbox:
    """Generate requests waiting to be posted (a `Mailbox`), with the inbox each one's frames go
    to."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: Mailbox[tuple[StreamedGenerate, DeltaInbox]] = Mailbox()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, request: StreamedGenerate, inbox: DeltaInbox) -> None:
        """Queue `request` and wake the poster; never blocks."""
        self._items.put((request, inbox))

    async def wait_batch(self) -> list[tuple[StreamedGenerate, DeltaInbox]]:
        """Wait until a request is queued, then take every request queued for the stream of the
        first one, in order (a request for another stream, opened after the first was lost, waits
        for the next batch)."""
        items: list[tuple[StreamedGenerate, DeltaInbox]] = []
        while not items:
            await self._items.wait()
            items = self._items.take()
        stream = items[0][0].stream
        for item in items:
            if item[0].stream != stream:
                self._items.put(item)  # in order: nothing was queued since the take
        return [item for item in items if item[0].stream == stream]


async def expire_inboxes(inboxes: dict[int, DeltaInbox], timeout_s: float) -> None:
    """Wake each inbox of `inboxes` whose deadline has passed, in time; runs until cancelled.
    Every inbox's deadline is its creation time plus the same `timeout_s` and `inboxes` is in
    creation order (a dict filled as requests start), so the first inbox has the earliest
    deadline: one timer for all requests, re-armed at most once per request."""
    while True:
        now = time.monotonic()
        wake_at = now + timeout_s  # no request yet: a new one's deadline is later than this
        for inbox in inboxes.values():
            if inbox.deadline > now:
                wake_at = inbox.deadline
                break
            inbox.wake()
        await anyio.sleep(max(wake_at - time.monotonic(), 0.0))
