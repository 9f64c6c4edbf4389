"""The live run page's HTTP app: a read-only Starlette app over a `RunView`, behind a secret.

Owns `page_app` and `PageAuth`. Every request needs the secret, as `Authorization: Bearer
<secret>` or as the `gyre_page` cookie; `GET /login?token=<one-time token>` sets that cookie once
per token (the URL the node prints) and sends the browser to the page. Without it: 401; an
unknown execution or segment: 404; a bad query parameter: 400. The page polls the JSON routes
(`/api/...`); file reads and tree building run in worker threads under one `CapacityLimiter`, so
the event loop the node shares with the proxy is never blocked. Knows nothing about the runtime
beyond the snapshot callable it is given.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from gyre.report.live.runview import STATES, RunView

__all__ = ["page_app", "PageAuth", "COOKIE", "STATIC_DIR"]

COOKIE = "gyre_page"
STATIC_DIR = Path(__file__).with_name("static")
_MAX_PAGE_SIZE = 500
_MAX_TOKENS = 4096


class PageAuth:
    """The run's `secret` and the one-time login tokens minted for it."""

    def __init__(self, secret: str) -> None:
        if not secret:
            raise ValueError("secret='' must not be empty: the page is only served behind one")
        self.secret = secret
        self._tokens: set[str] = set()

    def one_time_token(self) -> str:
        """A fresh token that `/login` accepts exactly once."""
        token = secrets.token_urlsafe(24)
        self._tokens.add(token)
        return token

    def redeem(self, token: str) -> bool:
        """Whether `token` was minted and unused (it is used up now)."""
        if token in self._tokens:
            self._tokens.discard(token)
            return True
        return False

    def allows(self, request: Request) -> bool:
        header = request.headers.get("authorization", "")
        given = (
            header[7:] if header.lower().startswith("bearer ") else request.cookies.get(COOKIE, "")
        )
        return bool(given) and hmac.compare_digest(given.encode(), self.secret.encode())


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _int(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    value = int(raw)  # ValueError -> 400
    if not lo <= value <= hi:
        raise ValueError(f"{name}={value} must be in [{lo}, {hi}]")
    return value


def page_app(
    view: RunView,
    auth: PageAuth,
    *,
    snapshot: Callable[[], dict | None] = lambda: None,
    poll_interval_s: float = 1.0,
    live: bool = False,
) -> Any:
    """The page's ASGI app over `view`; `snapshot` gives the live runtime's state (on the loop)."""
    limiter = anyio.CapacityLimiter(2)

    async def in_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await anyio.to_thread.run_sync(partial(fn, *args, **kwargs), limiter=limiter)

    async def login(request: Request) -> Response:
        if not auth.redeem(request.query_params.get("token", "")):
            return _error(
                401, "this login link is unknown or was used already; ask the node for a new one"
            )
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, auth.secret, httponly=True, samesite="strict", path="/")
        return response

    async def index(request: Request) -> Response:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-store"})

    async def info(request: Request) -> Response:
        return JSONResponse(
            {
                "run_dir": str(view.run_dir),
                "poll_interval_s": poll_interval_s,
                "live": live,
                "states": list(STATES),
            }
        )

    async def steps(request: Request) -> Response:
        return JSONResponse(await in_thread(view.steps))

    async def cells(request: Request) -> Response:
        cursor = {k: _int(request, k, 0, 0, 1 << 40) for k in ("intervals", "roles", "water")}
        return JSONResponse(await in_thread(view.cells, cursor, snapshot()))

    async def executions(request: Request) -> Response:
        state = request.query_params.get("state", "")
        if state and state not in STATES:
            return _error(400, f"state={state!r} must be one of {', '.join(STATES)}")
        page = _int(request, "page", 0, 0, 1 << 30)
        size = _int(request, "page_size", 50, 1, _MAX_PAGE_SIZE)
        return JSONResponse(
            await in_thread(
                view.executions,
                state=state,
                query=request.query_params.get("q", ""),
                page=page,
                page_size=size,
                live=snapshot(),
            )
        )

    async def execution(request: Request) -> Response:
        eid = request.path_params["execution_id"]
        try:
            return JSONResponse(await in_thread(view.execution, eid, snapshot()))
        except KeyError:
            return _error(404, f"no execution {eid!r} in this run")

    async def tokens(request: Request) -> Response:
        eid = request.path_params["execution_id"]
        offset = _int(request, "offset", 0, 0, 1 << 40)
        limit = _int(request, "limit", 512, 1, _MAX_TOKENS)
        try:
            return JSONResponse(
                await in_thread(view.tokens, eid, request.path_params["segment"], offset, limit)
            )
        except KeyError:
            return _error(404, f"no execution {eid!r} in this run")
        except IndexError as exc:
            return _error(404, str(exc))

    app = Starlette(
        routes=[
            Route("/login", login),
            Route("/", index),
            Route("/api/info", info),
            Route("/api/steps", steps),
            Route("/api/cells", cells),
            Route("/api/executions", executions),
            Route("/api/executions/{execution_id}", execution),
            Route("/api/executions/{execution_id}/segments/{segment:int}", tokens),
            Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
        ]
    )

    async def bad_value(request: Request, exc: Exception) -> Response:
        return _error(400, str(exc))

    app.add_exception_handler(ValueError, bad_value)
    return _Guard(app, auth)


class _Guard:
    """ASGI wrapper: every HTTP request but `/login` needs the secret (401 without it)."""

    def __init__(self, app: Starlette, auth: PageAuth) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] != "/login":
            if not self.auth.allows(Request(scope)):
                response = _error(
                    401,
                    "the run page needs the run's secret: open the login URL the node "
                    "printed, or send 'Authorization: Bearer <secret>'",
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
