"""`gyre._asgi.serve_asgi`: a connection its client closed ends at once; an idle one is closed
after `KEEP_ALIVE_S`, which outlasts the idle expiry of httpx's pool; a request in flight longer
than that is answered whole, and a pooled client that waited longer reconnects by itself."""

from __future__ import annotations

import random
import socket
import struct
from functools import partial
from pathlib import Path

import anyio
import httpx
import pytest

from gyre import _asgi
from gyre._asgi import KEEP_ALIVE_S, serve_asgi

pytestmark = pytest.mark.anyio

SHORT_KEEP_ALIVE_S = 0.5
"""`KEEP_ALIVE_S` in the tests that wait for the timer (the real one is 120 s)."""


def _app(delay_s: float = 0.0):
    """An ASGI app answering every request with `ok` after `delay_s` (lifespan handled)."""

    async def app(scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        await anyio.sleep(delay_s)
        headers = [(b"content-type", b"text/plain"), (b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})

    return app


def test_the_keep_alive_outlasts_the_idle_expiry_of_httpx_pools():
    """httpx (so the OpenAI and Anthropic SDKs) drops a connection idle longer than its pool's
    `keepalive_expiry` (5 s by default) itself, so it never sends a call on one the server is
    closing."""
    assert KEEP_ALIVE_S > httpx.Limits(max_connections=None).keepalive_expiry == 5.0


async def test_agents_that_call_about_once_a_second_never_meet_a_closing_connection():
    """32 agents, each on its own keep-alive httpx client, call every 0.95-1.05 s, 8 times. A call
    sent on a connection the server is closing fails unread: with a 1-s keep-alive 11 of 480 such
    calls failed (2026-12-07); with `KEEP_ALIVE_S` none may."""
    errors: list[BaseException] = []

    async def agent(http: httpx.AsyncClient, rng: random.Random) -> None:
        for _ in range(8):
            try:
                assert (await http.get("/")).text == "ok"
            except httpx.TransportError as exc:
                errors.append(exc)
            await anyio.sleep(rng.uniform(0.95, 1.05))

    async with anyio.create_task_group() as tg:
        port = await tg.start(partial(serve_asgi, _app(0.01), host="127.0.0.1", port=0))
        clients = [httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") for _ in range(32)]
        async with anyio.create_task_group() as agents:
            for i, http in enumerate(clients):
                agents.start_soon(agent, http, random.Random(i))
        for http in clients:
            await http.aclose()
        tg.cancel_scope.cancel()
    assert errors == []


async def test_an_idle_connection_is_closed_after_the_keep_alive(anyio_backend, monkeypatch):
    """A client that keeps its connection open after a response sees the server close it after
    `KEEP_ALIVE_S` (here 0.5 s), within scheduling slack, and not before."""
    monkeypatch.setattr(_asgi, "KEEP_ALIVE_S", SHORT_KEEP_ALIVE_S)
    async with anyio.create_task_group() as tg:
        port = await tg.start(partial(serve_asgi, _app(), host="127.0.0.1", port=0))
        async with await anyio.connect_tcp("127.0.0.1", port) as client:
            await client.send(b"GET / HTTP/1.1\r\nHost: gyre\r\n\r\n")
            reply = b""
            while not reply.endswith(b"ok"):
                reply += await client.receive()
            assert reply.startswith(b"HTTP/1.1 200")
            started = anyio.current_time()
            with anyio.fail_after(SHORT_KEEP_ALIVE_S + 2):
                with pytest.raises(anyio.EndOfStream):
                    await client.receive()
            assert anyio.current_time() - started >= SHORT_KEEP_ALIVE_S - 0.2
        tg.cancel_scope.cancel()


def _close_wait_sockets(port: int) -> int:
    """Sockets of this host in CLOSE-WAIT (state 08 of /proc/net/tcp) on local port `port`."""
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(
        1
        for row in rows
        if (fields := row.split())[3] == "08" and int(fields[1].split(":")[1], 16) == port
    )


@pytest.mark.parametrize("idle_s", [0.0, 0.3])
async def test_a_connection_its_client_closed_is_let_go_at_once(anyio_backend, idle_s):
    """A client reads its response, waits `idle_s` and closes its socket. Hypercorn 0.18 kept its
    end open (CLOSE-WAIT) until the keep-alive timer ended (on asyncio always, on trio once the
    timer had started); `serve_asgi` lets it go at once, 120 s before the timer."""
    async with anyio.create_task_group() as tg:
        port = await tg.start(partial(serve_asgi, _app(), host="127.0.0.1", port=0))
        client = await anyio.connect_tcp("127.0.0.1", port)
        await client.send(b"GET / HTTP/1.1\r\nHost: gyre\r\n\r\n")
        reply = b""
        while not reply.endswith(b"ok"):
            reply += await client.receive()
        await anyio.sleep(idle_s)
        await client.aclose()
        with anyio.fail_after(2):
            while _close_wait_sockets(port):
                await anyio.sleep(0.05)
        tg.cancel_scope.cancel()


def _open_sockets() -> int:
    """Sockets among this process's file descriptors."""
    count = 0
    for fd in Path("/proc/self/fd").iterdir():
        try:
            count += fd.readlink().name.startswith("socket:")
        except OSError:
            pass  # closed meanwhile
    return count


async def test_a_connection_reset_mid_request_is_let_go_when_the_request_ends(anyio_backend):
    """A client sends a request and resets its connection (RST) before the answer, as a killed
    agent does. The read fails, so h11 never sees an end of file and recycles the connection when
    the request ends, which started the keep-alive timer again on trio (the socket held 120 s);
    `serve_asgi` lets it go once the request ends (here after 0.3 s)."""
    async with anyio.create_task_group() as tg:
        app = _app(delay_s=0.3)
        port = await tg.start(partial(serve_asgi, app, host="127.0.0.1", port=0))
        before = _open_sockets()
        client = socket.create_connection(("127.0.0.1", port))
        client.sendall(b"GET / HTTP/1.1\r\nHost: gyre\r\n\r\n")
        await anyio.sleep(0.1)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # with a zero linger: a reset
        with anyio.fail_after(2):
            while _open_sockets() > before:
                await anyio.sleep(0.05)
        tg.cancel_scope.cancel()


async def test_a_request_longer_than_the_keep_alive_is_answered_and_a_pooled_client_reconnects(
    anyio_backend, monkeypatch
):
    """A response that takes `KEEP_ALIVE_S` + 0.5 s arrives whole (a request in flight is not
    idle); a second call after the connection sat idle past `KEEP_ALIVE_S` succeeds on a new
    connection of httpx's pool (`KEEP_ALIVE_S` here 0.5 s)."""
    monkeypatch.setattr(_asgi, "KEEP_ALIVE_S", SHORT_KEEP_ALIVE_S)
    async with anyio.create_task_group() as tg:
        app = _app(delay_s=SHORT_KEEP_ALIVE_S + 0.5)
        port = await tg.start(partial(serve_asgi, app, host="127.0.0.1", port=0))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            first = await http.get("/a")
            first_stream = first.extensions["network_stream"]
            await anyio.sleep(SHORT_KEEP_ALIVE_S + 0.5)
            second = await http.get("/b")
        assert (first.status_code, first.text, second.status_code, second.text) == (
            200,
            "ok",
            200,
            "ok",
        )
        assert second.extensions["network_stream"] is not first_stream  # a new connection
        tg.cancel_scope.cancel()
