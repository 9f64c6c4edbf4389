"""The execution API of the gateway: HTTP routes over an `ExternalRollout`, and serving it.

Owns `ExecutionApi` (the Starlette app), `admin_token`, `open_gateway` (the run's
`ExternalRollout` with its API served and its address in `<run_dir>/gateway.json`; `open_rollout`
calls it under `[gateway] enabled`) and `serve_app` (Hypercorn in the current event loop).
Routes, all behind `Authorization: Bearer <admin token>`:

    POST   /gyre/v1/executions                 {"task_id"?, "wait_s"?}  -> 201 Claimed | 204
    GET    /gyre/v1/executions                 -> pending and open executions, statistics
    POST   /gyre/v1/executions/{id}/reward     {"reward": r in [0, 1], "passed"?: bool}
    POST   /gyre/v1/executions/{id}/verify     -> the sealed verifier's score (once)
    POST   /gyre/v1/executions/{id}/close      -> the outcome (also `DELETE .../{id}`)

Errors are OpenAI-shaped JSON (`{"error": {"message", "type", "param", "code"}}`) with the
status the operation raised. Knows nothing about executions beyond `ExternalRollout`'s methods.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gyre._asgi import serve_asgi
from gyre.config import GatewayConfig, RunConfig
from gyre.errors import GyreError, ProxyError
from gyre.rollout.gateway import ExternalRollout
from gyre.rollout.tasks import configured_tasks
from gyre.tasks.outcome import Outcome
from gyre.tito.openai_requests import proxy_error
from gyre.tito.proxy import TitoProxy
from gyre.tito.wire import error_body

__all__ = ["ExecutionApi", "TOKEN_ENV", "admin_token", "open_gateway", "serve_app"]

logger = logging.getLogger(__name__)

TOKEN_ENV = "GYRE_GATEWAY_TOKEN"
"""Environment variable holding the admin token when `gateway.admin_token` is empty."""

_MAX_BODY_BYTES = 64 * 2**10
_ENCODER = msgspec.json.Encoder()


class _ClaimRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    task_id: str | None = None
    """Claim only an execution of this task (it must be one of the run's tasks)."""
    wait_s: float = 0.0
    """Wait up to this long for a pending execution (capped at `gateway.max_claim_wait_s`)."""


class _RewardRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    reward: float
    """The execution's reward in [0, 1] (`Score.score`)."""
    passed: bool | None = None
    """Whether the task counts as solved (the pass rate); default: reward == 1."""


class _Empty(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The body of verify and close: nothing, or `{}`."""


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        _ENCODER.encode(body), status_code=status, media_type="application/json", headers=headers
    )


def _outcome_body(outcome: Outcome) -> dict[str, Any]:
    return {
        "execution_id": outcome.execution_id,
        "task_id": outcome.task_id,
        "termination": outcome.termination,
        "reward": outcome.reward,
        "passed": None if outcome.score is None else outcome.score.all_passed,
        "failure_reason": outcome.failure_reason,
        "model_calls": outcome.model_calls,
        "completion_tokens": outcome.completion_tokens,
    }


class ExecutionApi:
    """The HTTP routes of `rollout` (the module docstring lists them); `admin_token` is the
    bearer token every request must carry (never an execution's key). `app` is the ASGI app."""

    def __init__(self, rollout: ExternalRollout, *, admin_token: str) -> None:
        if not admin_token:
            raise ValueError("admin_token must not be empty")
        self.rollout = rollout
        self.admin_token = admin_token
        base = "/gyre/v1/executions"
        self.app = Starlette(
            routes=[
                Route(base, self._claim, methods=["POST"]),
                Route(base, self._list, methods=["GET"]),
                Route(base + "/{execution_id}/reward", self._reward, methods=["POST"]),
                Route(base + "/{execution_id}/verify", self._verify, methods=["POST"]),
                Route(base + "/{execution_id}/close", self._close, methods=["POST"]),
                Route(base + "/{execution_id}", self._close, methods=["DELETE"]),
            ]
        )

    async def _answer(
        self,
        request: Request,
        decoder: type,
        handle: Callable[[Any, str | None], Awaitable[Response]],
    ) -> Response:
        """Check the admin token, decode the body as `decoder` (empty: its defaults), run
        `handle(body, execution_id)`; a `GyreError` becomes its JSON error (counted refused)."""
        try:
            self._authorize(request)
            body = await self._read(request, decoder)
            response = await handle(body, request.path_params.get("execution_id"))
        except GyreError as exc:
            self.rollout.note_request(refused=True)
            return self._error(exc)
        self.rollout.note_request(refused=False)
        return response

    def _authorize(self, request: Request) -> None:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), self.admin_token.encode()
        ):
            raise proxy_error(
                "the execution API needs `Authorization: Bearer <gateway admin token>` "
                "(an execution's key is not one)",
                401,
                "invalid_admin_token",
                type="authentication_error",
            )

    async def _read(self, request: Request, decoder: type) -> Any:
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > _MAX_BODY_BYTES:
                raise proxy_error(
                    f"request body over {_MAX_BODY_BYTES} bytes", 413, "request_too_large"
                )
        try:
            return msgspec.json.decode(body or b"{}", type=decoder)
        except msgspec.ValidationError as exc:
            raise proxy_error(f"invalid request: {exc}", 400, "invalid_request") from None
        except msgspec.DecodeError as exc:
            raise proxy_error(f"the body is not JSON: {exc}", 400, "invalid_json") from None
        except RecursionError:
            raise proxy_error("the body's JSON is nested too deeply", 400, "invalid_json") from None

    @staticmethod
    def _error(exc: GyreError) -> Response:
        code = exc.error_code if isinstance(exc, ProxyError) else exc.code
        param = exc.param if isinstance(exc, ProxyError) else None
        if exc.http_status >= 500:
            logger.error("gateway request failed: %s", exc)
        return Response(
            error_body(str(exc), type=exc.http_type, code=code, param=param),
            status_code=exc.http_status,
            media_type="application/json",
        )

    async def _claim(self, request: Request) -> Response:
        async def handle(req: _ClaimRequest, _: str | None) -> Response:
            claimed = await self.rollout.claim(task_id=req.task_id, wait_s=req.wait_s)
            if claimed is None:
                return Response(status_code=204)
            location = f"/gyre/v1/executions/{claimed.execution_id}"
            return _json(claimed, 201, headers={"location": location})

        return await self._answer(request, _ClaimRequest, handle)

    async def _list(self, request: Request) -> Response:
        async def handle(_body: _Empty, _: str | None) -> Response:
            return _json({**self.rollout.listing(), "statistics": self.rollout.statistics()})

        return await self._answer(request, _Empty, handle)

    async def _reward(self, request: Request) -> Response:
        async def handle(req: _RewardRequest, execution_id: str | None) -> Response:
            assert execution_id is not None
            score = self.rollout.post_reward(execution_id, req.reward, req.passed)
            return _json(
                {"execution_id": execution_id, "reward": score.score, "passed": score.all_passed}
            )

        return await self._answer(request, _RewardRequest, handle)

    async def _verify(self, request: Request) -> Response:
        async def handle(_body: _Empty, execution_id: str | None) -> Response:
            assert execution_id is not None
            score = await self.rollout.verify(execution_id)
            return _json(
                {
                    "execution_id": execution_id,
                    "reward": score.score,
                    "passed": score.all_passed,
                    "tests_passed": score.passed,
                    "tests_total": score.total,
                }
            )

        return await self._answer(request, _Empty, handle)

    async def _close(self, request: Request) -> Response:
        async def handle(_body: _Empty, execution_id: str | None) -> Response:
            assert execution_id is not None
            return _json(_outcome_body(await self.rollout.close(execution_id)))

        return await self._answer(request, _Empty, handle)


def admin_token(config: GatewayConfig) -> str:
    """The execution API's bearer token: `config.admin_token`, else `$GYRE_GATEWAY_TOKEN`, else a
    random one, printed once (it is never written to a file)."""
    token = config.admin_token or os.environ.get(TOKEN_ENV, "")
    if not token:
        token = secrets.token_urlsafe(24)
        print(f"gateway: admin token {token} (set gateway.admin_token or ${TOKEN_ENV})", flush=True)
    return token


@asynccontextmanager
async def open_gateway(
    config: RunConfig, proxy: TitoProxy, *, base_url: str, max_concurrent: int
) -> AsyncIterator[ExternalRollout]:
    """The run's `ExternalRollout` (`ExternalRollout.from_config`, claims limited to the tasks of
    `config.tasks.suites`) with its `ExecutionApi` served on `gateway.host:port`; its address and
    the proxy's are written to `<run_dir>/gateway.json` (`url`, `base_url`; never the token)
    and printed. Stops serving on exit. Raises `OSError` when the address cannot be bound."""
    task_ids = [t.task_id for t in configured_tasks(config)]
    rollout = ExternalRollout.from_config(
        config, proxy, base_url=base_url, max_concurrent=max_concurrent, task_ids=task_ids
    )
    gw = config.gateway
    api = ExecutionApi(rollout, admin_token=admin_token(gw))
    async with anyio.create_task_group() as tg:
        port = await tg.start(partial(serve_app, api.app, host=gw.host, port=gw.port))
        url = f"http://{gw.host}:{port}/gyre/v1"
        run_dir = Path(config.run_dir).resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "gateway.json").write_bytes(_ENCODER.encode({"url": url, "base_url": base_url}))
        print(f"gateway: execution API at {url}/executions, proxy at {base_url}", flush=True)
        yield rollout
        tg.cancel_scope.cancel()


async def serve_app(
    app: Any, *, host: str, port: int, task_status=anyio.TASK_STATUS_IGNORED
) -> None:
    """Serve the ASGI `app` on `host:port` (0: a free port) until cancelled (`gyre._asgi`);
    reports the bound port through `task_status`. Raises `OSError` when the address cannot be
    bound."""
    await serve_asgi(app, host=host, port=port, log=logger, task_status=task_status)
