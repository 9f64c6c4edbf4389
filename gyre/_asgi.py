"""Serving an ASGI app with Hypercorn inside the caller's event loop (trio or asyncio).

Owns `listening_socket` (bind first, so a port that cannot be had fails before anything is served),
`serve_asgi`, which every gyre HTTP server uses (the TITO proxy, the gateway's execution API, the
live run page and the head's join endpoint), and `KEEP_ALIVE_S`, how long those servers keep an idle
connection. Knows nothing about what the apps serve or who their clients are.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import sniffio

__all__ = ["KEEP_ALIVE_S", "listening_socket", "serve_asgi"]

logger = logging.getLogger("gyre.http")

KEEP_ALIVE_S = 1.0
"""Seconds an idle HTTP/1.1 connection is kept open (Hypercorn's `keep_alive_timeout`, 5 s by
default). Hypercorn 0.18 also holds a connection its client closed until this timer ends (on
asyncio after any close; on trio when the close races the end of the response, as under load):
the socket stays in CLOSE-WAIT and its task and objects alive. A client that opens a connection a
call (httpx without keep-alive, as `bench_engine` does) left 865-1,487 such sockets on trio under
~300 calls/s (2026-12-06), and full collections walk what they hold. Measured 2026-12-07, the
proxy in front of a scripted engine, 300 batches of 32 calls on new connections, runs
interleaved: proxy CPU 16.1-21.5 s at 5 s (5 runs), 19.1-22.1 at 2 s (3), 15.6-18.4 at 1 s (4),
13.1-16.0 at 0.5 s (2); batches over twice the median 22-24, 18-21, 7-14, 9-10; time in full
collections 4.2-4.7 s at 5 s, 3.0-3.1 at 2 s, 2.2-2.4 at 1 s.
The timer runs while a connection waits for a request: from its accept to the request's headers
(a client sends them at once) and from a response's end to the next request; a request in flight
is never idle. A client that waits longer reconnects: httpx drops a pooled connection the server
closed (`httpcore.AsyncHTTP11Connection.has_expired`). A request sent as the server closes fails
unread, so a retry is safe: the OpenAI and Anthropic SDKs retry it, browsers retry an idempotent
request on a reused connection, the worker's `POST /cell_exit` tries 3 times."""


def listening_socket(host: str, port: int, *, backlog: int = 128) -> socket.socket:
    """A listening TCP socket on `host:port` (0: a free port; an IPv6 host if it holds `:`), with
    `SO_REUSEADDR` and `TCP_NODELAY`. Raises `OSError` (including `socket.gaierror` for a host that
    does not resolve) when the address cannot be bound."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


async def serve_asgi(
    app: Any,
    *,
    host: str,
    port: int,
    backlog: int = 128,
    alongside: Sequence[Callable[[], Awaitable[None]]] = (),
    log: logging.Logger = logger,
    task_status=anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` on `host:port` until cancelled; binds first, then reports the bound port
    through `task_status` (so `port = await tg.start(...)` can connect at once). `alongside`:
    coroutine functions run for as long as the server (e.g. the call log's fsync timer).
    Raises `OSError` when the address cannot be bound.

    An idle connection is closed after `KEEP_ALIVE_S`. Hypercorn stops through its shutdown
    trigger, not by cancellation (its asyncio worker mishandles `CancelledError`): on cancellation
    the trigger fires and the server gets its graceful period (1 s) inside a shielded scope.
    """
    from hypercorn.config import Config as HypercornConfig

    if sniffio.current_async_library() == "trio":
        from hypercorn.trio import serve as hypercorn_serve
    else:
        from hypercorn.asyncio import serve as hypercorn_serve
    sock = listening_socket(host, port, backlog=backlog)
    bound = sock.getsockname()[1]
    hc = HypercornConfig()
    hc.bind = [f"fd://{sock.detach()}"]  # Hypercorn owns and closes the socket from here
    hc.accesslog = None
    hc.errorlog = log
    hc.graceful_timeout = 1.0
    hc.keep_alive_timeout = KEEP_ALIVE_S
    shutdown = anyio.Event()

    async def run_server() -> None:
        with anyio.CancelScope(shield=True):
            await hypercorn_serve(app, hc, shutdown_trigger=shutdown.wait, mode="asgi")

    async with anyio.create_task_group() as tg:
        for fn in alongside:
            tg.start_soon(fn)
        tg.start_soon(run_server)
        task_status.started(bound)
        try:
            await anyio.sleep_forever()
        finally:
            shutdown.set()
            tg.cancel_scope.cancel()
