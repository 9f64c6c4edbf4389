"""Several hosts under one head node: the head's join endpoint and a worker's side of it.

Owns `JoinServer` (the head: `POST /join` hands a worker the run's config, its gradient-group ranks
and the TCPStore's address; `POST /offer` takes the worker's ready cells and stays open for the run
as its liveness channel, heartbeats down, the end of the run as `done`; `POST /cell_exit` reports a
worker's cell that exited), `RemoteCellProcess` (a remote cell as the elastic runtime watches it:
`poll()` is its exit code once its worker reported it or went away) and `run_worker` (`python -m
gyre.node --join HEAD:PORT`). Every request carries the shared join secret (`[cluster] secret` or
`$GYRE_JOIN_SECRET`); one without it, or with another, is refused with a 401 and logged on the
head. The head drives remote cells as local ones: only their base URL is another host's. Knows
nothing about what cells run or how the elastic runtime moves them.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec

from gyre.cell.wire import CELL_SECRET_ENV, cell_secret
from gyre.config import RunConfig
from gyre.config.cluster import JOIN_SECRET_ENV
from gyre.errors import ConfigError, EngineTimeoutError

__all__ = [
    "JoinServer",
    "JoinReply",
    "OfferedCell",
    "RemoteCellProcess",
    "open_join_server",
    "run_worker",
    "WORKER_LOST_EXIT",
]

logger = logging.getLogger(__name__)

WORKER_LOST_EXIT = -9
"""`RemoteCellProcess.poll()` of a cell whose worker went away (its connection ended): as a
process killed by SIGKILL reports."""
_DONE = b"done\n"
_BEAT = b".\n"


class JoinRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A worker's `POST /join` body (with the join secret in its header)."""

    host: str
    """The worker's address as the head reaches it (its cells bind there)."""


class JoinReply(msgspec.Struct, frozen=True, kw_only=True):
    """The head's answer to an accepted join: what the worker's cells need to start."""

    worker: int
    """1-based index of the worker (the head is 0)."""
    config: dict[str, Any]
    """The run config (`RunConfig` as plain data): the worker starts `cells.num_cells` cells."""
    model_dir: str
    """The model folder the cells load (the head's warm-started one; on a shared filesystem)."""
    store: str
    """"HOST:PORT" of the gradient group's TCPStore on the head."""
    first_rank: int
    """The run-wide rank of the worker's first cell (its others follow)."""
    world_size: int
    """Ranks in the run-wide gradient group (every cell of every host)."""
    cell_secret: str
    """The head's cell secret: every cell request carries it (`GYRE_CELL_SECRET`)."""
    heartbeat_s: float
    """Seconds between the head's heartbeats on the offer connection."""


class OfferedCell(msgspec.Struct, frozen=True, kw_only=True):
    """One started cell of a worker: its run-wide rank and HTTP base URL."""

    rank: int
    url: str


class Offer(msgspec.Struct, frozen=True, kw_only=True):
    """A worker's `POST /offer` body: its started cells (the connection then stays open)."""

    worker: int
    cells: list[OfferedCell]


class CellExit(msgspec.Struct, frozen=True, kw_only=True):
    """A worker's `POST /cell_exit` body: a cell of it exited with `code`."""

    worker: int
    rank: int
    code: int


class RemoteCellProcess:
    """A cell on a worker host as a `gyre.cell.client.WatchedProcess` (`poll()`): None while it
    runs, its exit code once its worker reported the exit, `WORKER_LOST_EXIT` once the worker's
    connection ended (a lost worker is all its cells dying)."""

    def __init__(self, worker: int, rank: int) -> None:
        self.worker = worker
        self.rank = rank
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


def _authorized(headers: list[tuple[bytes, bytes]], secret: str) -> bool:
    for name, value in headers:
        if name == b"authorization":
            return hmac.compare_digest(value, f"Bearer {secret}".encode())
    return False


def _client_of(scope: dict) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "?"


async def _body(receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise anyio.EndOfStream
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _answer(send, status: int, body: bytes, content_type: bytes = b"application/json"):
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type)],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _error(message: str, code: str) -> bytes:
    return json.dumps({"error": {"message": message, "code": code}}).encode()


class JoinServer:
    """The head's join endpoint (an ASGI app; see the module docstring).

    Args:
        config: the run config (sent to every worker; `cluster.workers` of them are awaited).
        model_dir: the model folder the workers' cells load.
        secret: the join secret every request must carry (non-empty).
    """

    def __init__(self, config: RunConfig, model_dir: str | Path, secret: str) -> None:
        if not secret:
            raise ConfigError(
                f"cluster.workers={config.cluster.workers} needs a join secret: set "
                f"[cluster] secret or ${JOIN_SECRET_ENV}"
            )
        self.config = config
        self.model_dir = str(model_dir)
        self.secret = secret
        self.cells_per_host = config.cells.num_cells
        self.world_size = self.cells_per_host * (config.cluster.workers + 1)
        self.port = 0
        """The port the endpoint is bound to (`cluster.port`, or the free one 0 picked)."""
        self.store: str | None = None
        self._store_set = anyio.Event()
        self.joined = 0
        self.refused = 0
        """Joins and other requests refused for a missing or wrong secret."""
        self.offers: dict[int, list[OfferedCell]] = {}
        self._all_offered = anyio.Event()
        self.processes: dict[int, RemoteCellProcess] = {}
        self.done = anyio.Event()
        """Set at the end of the run: every worker's connection ends with `done`."""
        self.lost: list[int] = []
        """Workers whose connection ended before `done`."""

    def set_store(self, address: str) -> None:
        """The gradient group's TCPStore is up at `address`: joins waiting for it are answered."""
        self.store = address
        self._store_set.set()

    async def wait_offers(self) -> list[tuple[int, str, RemoteCellProcess]]:
        """Every worker's cells once all `cluster.workers` offered them: (rank, base URL, process).
        Raises `EngineTimeoutError` after `cluster.join_timeout_s`."""
        timeout_s = self.config.cluster.join_timeout_s
        with anyio.move_on_after(timeout_s):
            await self._all_offered.wait()
        if not self._all_offered.is_set():
            raise EngineTimeoutError(
                f"{len(self.offers)} of cluster.workers={self.config.cluster.workers} workers "
                f"offered their cells within cluster.join_timeout_s={timeout_s}"
            )
        return [
            (cell.rank, cell.url, self.processes[cell.rank])
            for cells in self.offers.values()
            for cell in cells
        ]

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":  # nothing to start or stop: acknowledge both
            while True:
                message = await receive()
                kind = message["type"].rpartition(".")[2]
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        if scope["type"] != "http":
            return
        path = scope["path"]
        if not _authorized(scope["headers"], self.secret):
            self.refused += 1
            logger.warning(
                "refused %s from %s: the join secret is missing or wrong", path, _client_of(scope)
            )
            await _answer(
                send,
                401,
                _error(
                    "join refused: the request's join secret is missing or differs from the "
                    f"head's ([cluster] secret or ${JOIN_SECRET_ENV})",
                    "join_refused",
                ),
            )
            return
        if scope["method"] != "POST" or path not in ("/join", "/offer", "/cell_exit"):
            await _answer(send, 404, _error(f"no route {scope['method']} {path}", "not_found"))
            return
        try:
            body = await _body(receive)
        except anyio.EndOfStream:
            return
        try:
            if path == "/join":
                await self._join(msgspec.json.decode(body, type=JoinRequest), send)
            elif path == "/offer":
                await self._offer(msgspec.json.decode(body, type=Offer), receive, send)
            else:
                exit_ = msgspec.json.decode(body, type=CellExit)
                process = self.processes.get(exit_.rank)
                if process is not None and process.worker == exit_.worker:
                    process.returncode = exit_.code
                    logger.warning(
                        "worker %d: cell rank %d exited (%d)", exit_.worker, exit_.rank, exit_.code
                    )
                await _answer(send, 200, b"{}")
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            await _answer(send, 400, _error(f"bad {path} body: {exc}", "invalid_request"))

    async def _join(self, request: JoinRequest, send) -> None:
        if self.joined >= self.config.cluster.workers:
            await _answer(
                send,
                409,
                _error(
                    f"the head already has its cluster.workers={self.config.cluster.workers}",
                    "run_full",
                ),
            )
            return
        self.joined += 1
        worker = self.joined
        await self._store_set.wait()
        assert self.store is not None
        logger.info("worker %d joined from %s", worker, request.host)
        reply = JoinReply(
            worker=worker,
            config=msgspec.to_builtins(self.config),
            model_dir=self.model_dir,
            store=self.store,
            first_rank=worker * self.cells_per_host,
            world_size=self.world_size,
            cell_secret=cell_secret(),
            heartbeat_s=self.config.cluster.heartbeat_s,
        )
        await _answer(send, 200, msgspec.json.encode(reply))

    async def _offer(self, offer: Offer, receive, send) -> None:
        """Take a worker's cells, then hold its connection for the run: heartbeats, then `done`;
        a connection that ends before `done` loses the worker (all its cells exit)."""
        first = offer.worker * self.cells_per_host
        ranks = sorted(c.rank for c in offer.cells)
        if ranks != list(range(first, first + self.cells_per_host)) or offer.worker in self.offers:
            await _answer(
                send,
                400,
                _error(f"worker {offer.worker} offered ranks {ranks}", "invalid_request"),
            )
            return
        for cell in offer.cells:
            self.processes[cell.rank] = RemoteCellProcess(offer.worker, cell.rank)
        self.offers[offer.worker] = offer.cells
        logger.info("worker %d offered cells %s", offer.worker, [c.url for c in offer.cells])
        if len(self.offers) == self.config.cluster.workers:
            self._all_offered.set()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/plain")],
            }
        )
        ended = False
        async with anyio.create_task_group() as tg:

            async def disconnected() -> None:
                nonlocal ended
                while (await receive())["type"] != "http.disconnect":
                    pass
                ended = True
                tg.cancel_scope.cancel()

            tg.start_soon(disconnected)
            while not self.done.is_set():
                with anyio.move_on_after(self.config.cluster.heartbeat_s):
                    await self.done.wait()
                if not self.done.is_set():
                    await send({"type": "http.response.body", "body": _BEAT, "more_body": True})
            await send({"type": "http.response.body", "body": _DONE})
            tg.cancel_scope.cancel()
        if ended and not self.done.is_set():
            self.lost.append(offer.worker)
            logger.warning("worker %d went away: its cells are lost", offer.worker)
            for cell in offer.cells:
                process = self.processes[cell.rank]
                if process.returncode is None:
                    process.returncode = WORKER_LOST_EXIT


@asynccontextmanager
async def open_join_server(config: RunConfig, model_dir: str | Path) -> AsyncIterator[JoinServer]:
    """Serve the head's join endpoint at `cluster.host:cluster.port` for the body; on exit every
    worker's connection ends with `done` (they stop their cells). Raises `ConfigError` without a
    join secret, `OSError` when the address cannot be bound."""
    from gyre._asgi import serve_asgi

    server = JoinServer(config, model_dir, config.cluster.join_secret())
    cluster = config.cluster
    async with anyio.create_task_group() as tg:
        server.port = await tg.start(
            lambda task_status: serve_asgi(
                server, host=cluster.host, port=cluster.port, task_status=task_status
            )
        )
        logger.info(
            "head: waiting for %d workers at %s:%d", cluster.workers, cluster.host, server.port
        )
        try:
            yield server
        finally:
            server.done.set()
            with anyio.CancelScope(shield=True):
                await anyio.sleep(min(1.0, cluster.heartbeat_s))  # the `done` lines go out
            tg.cancel_scope.cancel()


# -- the worker ----------------------------------------------------------------------------------


def _raise_refused(head: str, response: httpx.Response) -> None:
    if response.status_code == 200:
        return
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text[:200]
    raise ConfigError(f"head {head} answered HTTP {response.status_code}: {message}")


async def run_worker(head: str, *, secret: str | None = None) -> int:
    """A worker's whole run: join the head at `head` ("HOST:PORT"), start this host's cells with
    the config and ranks it sends, offer them, keep them until the head says `done` (returns 0) or
    goes away (returns 1). Cells bind to this host's address on the route to the head.

    Raises `ConfigError` without a secret (`$GYRE_JOIN_SECRET`) or when the head refuses the join
    (a wrong secret: the head's 401 message), `EngineError` when a cell fails to start."""
    from gyre.cell.grad_group import local_address_for
    from gyre.cell.spawn import open_cells
    from gyre.config import config_from_dict

    secret = secret if secret is not None else os.environ.get(JOIN_SECRET_ENV, "")
    if not secret:
        raise ConfigError(f"--join needs the run's join secret in ${JOIN_SECRET_ENV}")
    host_name, sep, port = head.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"--join {head!r} must be HEAD:PORT")
    address = local_address_for(host_name)
    headers = {"Authorization": f"Bearer {secret}"}
    base = f"http://{head}"
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60.0) as http:
        try:
            response = await http.post(
                "/join", content=msgspec.json.encode(JoinRequest(host=address))
            )
        except httpx.TransportError as exc:
            raise ConfigError(f"cannot reach the head at {head}: {exc!r}") from None
        _raise_refused(head, response)
        reply = msgspec.json.decode(response.content, type=JoinReply)
        config = config_from_dict(reply.config)
        os.environ[CELL_SECRET_ENV] = reply.cell_secret  # the cells inherit it
        logger.info(
            "joined %s as worker %d: ranks %d..%d of %d",
            head,
            reply.worker,
            reply.first_rank,
            reply.first_rank + config.cells.num_cells - 1,
            reply.world_size,
        )
        log_dir = Path(config.run_dir).resolve() / "cells" / f"worker-{reply.worker}"
        async with open_cells(
            config.cells.num_cells,
            reply.model_dir,
            config.engine,
            log_dir=log_dir,
            trainer_config=config.trainer,
            rl_config=config.rl,
            host=address,
            first_rank=reply.first_rank,
            world_size=reply.world_size,
            group_store=reply.store,
            devices_per_cell=config.cells.devices_per_cell,
        ) as clients:
            offered = []
            for c in clients:
                assert c.rank is not None, "open_cells ranks every cell it opens"
                offered.append(OfferedCell(rank=c.rank, url=c.base_url))
            offer = Offer(worker=reply.worker, cells=offered)
            return await _hold(http, offer, clients, reply.heartbeat_s)


async def _report_exit(
    http: httpx.AsyncClient, body: CellExit, *, attempts: int = 3, pause_s: float = 0.5
) -> bool:
    """`POST /cell_exit` with `body`, tried up to `attempts` times `pause_s` apart on a transport
    error: a pooled connection the head closes as it is reused fails without the head having read
    the request (its idle connections close after `gyre._asgi.KEEP_ALIVE_S`), and the head takes a
    repeated report as one. Returns whether the head answered; False when it is gone (the offer
    stream ends too)."""
    for attempt in range(attempts):
        try:
            await http.post("/cell_exit", content=msgspec.json.encode(body))
            return True
        except httpx.TransportError:
            if attempt + 1 < attempts:
                await anyio.sleep(pause_s)
    return False


async def _hold(http: httpx.AsyncClient, offer: Offer, clients, heartbeat_s: float) -> int:
    """Offer the cells and keep the connection until `done` (0) or its end (1); report a cell that
    exits meanwhile (`POST /cell_exit`)."""
    reported: set[int] = set()
    result = 1
    async with anyio.create_task_group() as tg:

        async def watch_cells() -> None:
            while True:
                await anyio.sleep(0.2)
                for client in clients:
                    code = client.process.poll()
                    if code is not None and client.rank not in reported:
                        reported.add(client.rank)
                        body = CellExit(worker=offer.worker, rank=client.rank, code=code)
                        await _report_exit(http, body)

        tg.start_soon(watch_cells)
        try:
            async with http.stream(
                "POST",
                "/offer",
                content=msgspec.json.encode(offer),
                timeout=httpx.Timeout(10 * heartbeat_s + 10.0, connect=10.0),
            ) as response:
                if response.status_code != 200:
                    await response.aread()
                    _raise_refused(str(http.base_url), response)
                async for line in response.aiter_lines():
                    if line == _DONE.decode().strip():
                        result = 0
                        break
        except (httpx.TransportError, httpx.RemoteProtocolError) as exc:
            logger.warning("the head went away (%r): stopping this host's cells", exc)
        tg.cancel_scope.cancel()
    if result:
        logger.warning("the head's connection ended before the run did: stopping the cells")
    return result
