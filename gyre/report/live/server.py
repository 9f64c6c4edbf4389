"""Serving the live run page: Hypercorn on the node's event loop, or on its own for a run folder.

Owns `serve_page` (bind, then serve an app until cancelled; reports the bound port through
`task_status`), `open_page` (the node's side: the page over a run folder and a live snapshot,
served in a task group of its own for the length of a `with` block, its one-time login URL
printed) and `serve_run_dir` (`python -m gyre.report RUN_DIR --serve`: the same page on a finished
or killed run). With the page off nothing here runs and no port is opened. Knows nothing about
how the run is produced.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio

from gyre._asgi import listening_socket, serve_asgi
from gyre.errors import ConfigError
from gyre.report.live.app import PageAuth, page_app
from gyre.report.live.runview import RunView

__all__ = [
    "serve_page",
    "open_page",
    "serve_run_dir",
    "check_address",
    "Page",
    "view_for",
    "tokenizer_decode",
]

logger = logging.getLogger(__name__)


def check_address(
    host: str, port: int, *, names: tuple[str, str] = ("observe.host", "observe.port")
) -> None:
    """Bind and release `host:port` once, so a page that cannot be served is refused before a run
    builds or starts anything. Raises `ConfigError` naming the two settings (`names`: the config
    keys, or the command-line flags), the address and the system's reason."""
    try:
        listening_socket(host, port).close()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(
            f"{names[0]}={host!r} / {names[1]}={port}: the page cannot listen there ({reason})"
        ) from None


async def serve_page(
    app: Any, *, host: str, port: int, task_status=anyio.TASK_STATUS_IGNORED
) -> None:
    """Serve `app` on `host:port` (0: a free port) until cancelled (`gyre._asgi`). Raises
    `OSError` when the address cannot be bound."""
    await serve_asgi(app, host=host, port=port, log=logger, task_status=task_status)


class Page:
    """A page being served: its address and a way to mint login URLs."""

    def __init__(self, host: str, port: int, auth: PageAuth) -> None:
        self.host = host
        self.port = port
        self.auth = auth

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def login_url(self) -> str:
        """A URL that logs one browser in once (sets the secret's cookie)."""
        return f"{self.base_url}/login?token={self.auth.one_time_token()}"


@asynccontextmanager
async def open_page(
    view: RunView,
    *,
    secret: str,
    host: str = "127.0.0.1",
    port: int = 0,
    snapshot: Callable[[], dict | None] = lambda: None,
    poll_interval_s: float = 1.0,
    live: bool = True,
    announce: Callable[[str], None] | None = print,
) -> AsyncIterator[Page]:
    """Serve the page over `view` for the block's length; `announce` gets the login line."""
    auth = PageAuth(secret)
    app = page_app(view, auth, snapshot=snapshot, poll_interval_s=poll_interval_s, live=live)
    async with anyio.create_task_group() as tg:
        bound = await tg.start(_serving(app, host, port))
        page = Page(host, bound, auth)
        if announce is not None:
            announce(
                f"run page: {page.login_url()} (one-time link; or send 'Authorization: Bearer "
                f"$GYRE_CELL_SECRET' to {page.base_url})"
            )
        try:
            yield page
        finally:
            tg.cancel_scope.cancel()


def _serving(app: Any, host: str, port: int) -> Callable[..., Any]:
    async def run(task_status=anyio.TASK_STATUS_IGNORED) -> None:
        await serve_page(app, host=host, port=port, task_status=task_status)

    return run


def serve_run_dir(
    view: RunView, *, secret: str, host: str, port: int, poll_interval_s: float = 2.0
) -> None:
    """Serve the page on a run folder until Ctrl-C (blocks; trio)."""

    async def main() -> None:
        async with open_page(
            view,
            secret=secret,
            host=host,
            port=port,
            poll_interval_s=poll_interval_s,
            live=False,
            announce=lambda line: print(line, flush=True),
        ):
            await anyio.sleep_forever()

    anyio.run(main, backend="trio")


def view_for(config: Any, *, decode: Any = None) -> RunView:
    """A `RunView` of `config.run_dir` read the way the run trains: its call log name, Jmax and
    role limits, and (several cells) the elastic runtime's loss denominator."""
    from pathlib import Path

    multi = config.cells.num_cells > 1
    return RunView(
        Path(config.run_dir).resolve(),
        log_name=config.proxy.log_name,
        jmax=config.trajectory.jmax,
        role_limits=dict(config.trajectory.role_limits or {}) or None,
        batch_executions=config.loop.batch_executions if multi else None,
        decode=decode,
    )


def tokenizer_decode(model_dir: Any) -> Callable[[list[int]], list[str]] | None:
    """Per-token text from the model folder's tokenizer (cached per ID); None when it has none."""
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError):
        return None
    cache: dict[int, str] = {}

    def decode(ids: list[int]) -> list[str]:
        out = []
        for i in ids:
            if i not in cache:
                # transformers types decode without overloads: one sequence decodes to a str
                cache[i] = tok.decode([i])  # type: ignore[assignment]
            out.append(cache[i])
        return out

    return decode
