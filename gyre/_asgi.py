"""Serving an ASGI app with Hypercorn inside the caller's event loop (trio or asyncio).

Owns `listening_socket` (bind first, so a port that cannot be had fails before anything is served),
`serve_asgi`, which every gyre HTTP server uses (the TITO proxy, the gateway's execution API, the
live run page and the head's join endpoint), and `KEEP_ALIVE_S`, how long those servers keep an idle
connection. Knows nothing about what the apps serve or who their clients are.
"""

from __future__ import annotations

import logging
import socket
import types
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import anyio
import sniffio

__all__ = ["KEEP_ALIVE_S", "listening_socket", "serve_asgi"]

logger = logging.getLogger("gyre.http")

KEEP_ALIVE_S = 120.0
"""Seconds an idle HTTP/1.1 connection is kept open (Hypercorn's `keep_alive_timeout`, 5 s by
default): longer than the idle expiry of the client pools agents use (httpx 5 s, so the OpenAI and
Anthropic SDKs; aiohttp 15 s; Node's undici 4 s; Go's `net/http` 90 s), so those clients close an
idle connection first and never send a call on one the server is closing (such a call fails
unread). The timer runs while a connection waits for a request: from its accept to the request's
headers and from a response's end to the next request; a request in flight is never idle. So a
client that connects and sends nothing holds a socket and a task for up to this long. A connection
its client closed, or whose read failed, does not wait for the timer: it ends once its request
does (`_close_on_eof`). Measurements: `docs/notes/http-connections.md`."""


def _close_on_eof(tcp_server: type) -> type:
    """Hypercorn's connection handler `tcp_server` (its trio or asyncio `TCPServer`), except that
    a connection ends as soon as it can read no more (its client closed it, or a read failed).
    Hypercorn 0.18 stops reading there but leaves the keep-alive timer running, and the
    connection's task group waits for it: the socket stays in CLOSE-WAIT, its task and objects
    alive, until `keep_alive_timeout` ends (measured: `docs/notes/http-connections.md`)."""

    from hypercorn.events import Updated

    class ClosingTCPServer(tcp_server):
        closes_on_eof = True
        _read_ended = False

        async def _read_data(self) -> None:
            await super()._read_data()
            self._read_ended = True
            await self.idle_task.stop()  # nothing more can arrive: let the connection end

        async def protocol_send(self, event) -> None:
            # A request that ends after the read did (a client reset mid-response: h11 never saw
            # an end of file, so it recycles the connection) would start the timer again
            if not (self._read_ended and isinstance(event, Updated) and event.idle):
                await super().protocol_send(event)

    return ClosingTCPServer


def _hypercorn_serve(library: str) -> Callable[..., Awaitable[None]]:
    """Hypercorn's `serve` for `library` ("trio" or "asyncio"), its connections handled by
    `_close_on_eof` (installed once a process in Hypercorn's module, where its `serve` looks the
    handler up)."""
    run_module: types.ModuleType  # either one: both define the `TCPServer` that `serve` uses
    serve: Callable[..., Awaitable[None]]
    if library == "trio":
        import hypercorn.trio.run as trio_run
        from hypercorn.trio import serve as trio_serve

        run_module, serve = trio_run, trio_serve
    else:
        import hypercorn.asyncio.run as asyncio_run
        from hypercorn.asyncio import serve as asyncio_serve

        run_module, serve = asyncio_run, asyncio_serve
    if not getattr(run_module.TCPServer, "closes_on_eof", False):
        # a class of Hypercorn's module, replaced in the namespace where `serve` looks it up
        vars(run_module)["TCPServer"] = _close_on_eof(run_module.TCPServer)
    return serve


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
    alongside: Sequence[Callable[[], Coroutine[Any, Any, None]]] = (),
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

    hypercorn_serve = _hypercorn_serve(sniffio.current_async_library())
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
