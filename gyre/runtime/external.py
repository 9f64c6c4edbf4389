"""External executions: the run's executions handed to agent loops run elsewhere, over HTTP.

Owns `ExternalRollout` (the rollout of the gateway: same contract as `Rollout`, `run(task,
execution_id) -> Executed`), `GatewayStatistics` and `check_gateway`. When the driver asks for an
execution, it is published as pending (its proxy key minted); an agent loop claims it with
`POST /gyre/v1/executions` and gets its key, the proxy's base URLs, the task and a workspace gyre
prepared; it runs its own agent against the TITO proxy, posts a reward (`.../reward`) or asks for
the task's sealed verifier (`.../verify`), and closes it (`.../close` or `DELETE`). An execution
not closed by its task's deadline, or past its turn or token limit, is closed by gyre and scored
on what its workspace holds (partial scoring, as the harness does); one no loop claims within
`gateway.claim_timeout_s` fails. The execution API answers only the admin token (never an
execution's key) and refuses bad input with a JSON error and a 4xx, losing nothing. Knows
nothing about trees, training or what the agent loop runs.
"""

from __future__ import annotations

import collections
import hmac
import logging
import math
import os
import secrets
import shutil
import socket
import time
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gyre.agents.control import ExecutionControl, check_execution_id
from gyre.config import GatewayConfig, RunConfig
from gyre.errors import ConfigError, GyreError, ProxyError, VerifierError
from gyre.runtime.rollout import Executed, run_jobs
from gyre.sandbox import Limits
from gyre.tasks.outcome import Outcome, Score, Termination
from gyre.tasks.scorer import score_workspace
from gyre.tasks.task import Task, load_suite
from gyre.tito.openai_format import proxy_error
from gyre.tito.proxy import TitoProxy
from gyre.tito.wire import error_body

__all__ = [
    "ExternalRollout",
    "GatewayStatistics",
    "check_gateway",
    "open_gateway",
    "serve_app",
    "TOKEN_ENV",
]

logger = logging.getLogger(__name__)

TOKEN_ENV = "GYRE_GATEWAY_TOKEN"
"""Environment variable holding the admin token when `gateway.admin_token` is empty."""

_POLL_S = 0.05
"""How often an open execution's limits are checked against the proxy's totals."""
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


_CLAIM_DECODER = msgspec.json.Decoder(_ClaimRequest)
_REWARD_DECODER = msgspec.json.Decoder(_RewardRequest)


class GatewayStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Counters of one `ExternalRollout` since it was built (docs/style.md rule 6); `running`,
    `finished`, `stopped` and `failed` mean what they mean for `HarnessStatistics`."""

    pending: int
    """Executions published and not claimed yet."""
    running: int
    """Executions claimed and not ended."""
    finished: int
    """Closed by their agent loop and scored."""
    stopped: int
    """Closed by gyre at their deadline, turn or token limit, and partially scored."""
    failed: int
    """Ended without a score (unclaimed, no model call, verifier failure)."""
    unclaimed: int
    """Of `failed`: no agent loop claimed them within `claim_timeout_s`."""
    rewards_posted: int
    verifications: int
    """Verifier runs asked for over HTTP (`.../verify`)."""
    requests_total: int
    requests_refused: int
    """Requests to the execution API answered with a 4xx or 5xx error."""


@dataclass(eq=False)
class _External:
    """One execution handed out over HTTP, from publication to its end."""

    task: Task
    execution_id: str
    key: str
    state: str = "pending"
    """pending -> open (claimed) -> closing (no reward, verify or close any more) -> closed."""
    claimed: anyio.Event = field(default_factory=anyio.Event)
    close_asked: anyio.Event = field(default_factory=anyio.Event)
    ended: anyio.Event = field(default_factory=anyio.Event)
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    """Held while a verifier runs and while gyre closes it: a close waits for a running verify."""
    exec_dir: Path | None = None
    claimed_s: float = 0.0
    """Unix time of the claim."""
    score: Score | None = None
    """The posted reward or the verifier's score; None: the verifier runs at the end."""
    failure: str | None = None
    """Set when the execution cannot run (its workspace could not be prepared)."""
    outcome: Outcome | None = None


def check_gateway(config: RunConfig) -> None:
    """Refuse, before a run starts, what the gateway cannot do: `require_isolation` (agent loops
    run outside gyre's sandbox) and an execution API address that cannot be bound. Raises
    `ConfigError` naming the keys; nothing when `[gateway]` is off."""
    gw = config.gateway
    if not gw.enabled:
        return
    if config.tasks.harness.require_isolation:
        raise ConfigError(
            "gateway.enabled with tasks.harness.require_isolation: agent loops of the gateway run "
            "outside gyre's sandbox, so their isolation cannot be required"
        )
    try:
        family = socket.AF_INET6 if ":" in gw.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((gw.host, gw.port))
    except OSError as exc:
        raise ConfigError(
            f"gateway.host={gw.host!r} / gateway.port={gw.port}: the execution API cannot listen "
            f"there ({exc.strerror or exc})"
        ) from None


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        _ENCODER.encode(body), status_code=status, media_type="application/json", headers=headers
    )


def _outcome_body(outcome: Outcome, calls: int) -> dict[str, Any]:
    return {
        "execution_id": outcome.execution_id,
        "task_id": outcome.task_id,
        "termination": outcome.termination,
        "reward": outcome.reward,
        "passed": None if outcome.score is None else outcome.score.all_passed,
        "failure_reason": outcome.failure_reason,
        "model_calls": calls,
        "completion_tokens": outcome.completion_tokens,
    }


class ExternalRollout:
    """The gateway's rollout: `await rollout.run(task, execution_id)` publishes the execution and
    returns its `Executed` once an agent loop closed it (or gyre did); `run_many` as `Rollout`.

    Args:
        proxy: the run's TITO proxy (keys, calls, summaries).
        config: `GatewayConfig`.
        base_url: the proxy's OpenAI base URL (`http://host:port/v1`) handed to agent loops; the
            Anthropic base URL is the same without `/v1` (the SDK appends `/v1/messages`).
        model: the served model name handed to agent loops.
        workspace_root: one private folder per execution (`<execution_id>/workspace`, a copy of
            the task's `environment/`, and `instruction.md`).
        verifier_limits: resource limits of the verifier (as the harness's).
        max_concurrent: most executions published or running at once.
        task_ids: the run's task ids (a claim naming another gets 404); None accepts any.
        keep_workspaces: keep each execution's folder after it ended.
        admin_token: the bearer token of the execution API.

    Serve the execution API with `port = await task_group.start(rollout.serve)`.
    """

    def __init__(
        self,
        proxy: TitoProxy,
        *,
        config: GatewayConfig,
        base_url: str,
        model: str,
        workspace_root: str | os.PathLike[str],
        admin_token: str,
        verifier_limits: Limits = Limits(),
        max_concurrent: int,
        task_ids: Collection[str] | None = None,
        keep_workspaces: bool = False,
    ) -> None:
        if not admin_token:
            raise ValueError("admin_token must not be empty")
        self.proxy = proxy
        self.config = config
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.workspace_root = Path(workspace_root)
        self.admin_token = admin_token
        self.verifier_limits = verifier_limits
        self.limiter = anyio.CapacityLimiter(max_concurrent)
        self.task_ids = None if task_ids is None else frozenset(task_ids)
        self.keep_workspaces = keep_workspaces
        self._pending: collections.OrderedDict[str, _External] = collections.OrderedDict()
        self._live: dict[str, _External] = {}
        """Every execution published and not ended (pending ones too)."""
        self._ended: dict[str, tuple[Outcome, int]] = {}
        """Ended executions: their outcome and call count (for a late request's 409)."""
        self._published = anyio.Event()
        """Set (and replaced) whenever an execution is published: wakes waiting claims."""
        self._template_ok: dict[str, bool] = {}
        self._counts = collections.Counter[str]()
        self.app = Starlette(
            routes=[
                Route("/gyre/v1/executions", self._claim_route, methods=["POST"]),
                Route("/gyre/v1/executions", self._list_route, methods=["GET"]),
                Route(
                    "/gyre/v1/executions/{execution_id}/reward",
                    self._reward_route,
                    methods=["POST"],
                ),
                Route(
                    "/gyre/v1/executions/{execution_id}/verify",
                    self._verify_route,
                    methods=["POST"],
                ),
                Route(
                    "/gyre/v1/executions/{execution_id}/close", self._close_route, methods=["POST"]
                ),
                Route("/gyre/v1/executions/{execution_id}", self._close_route, methods=["DELETE"]),
            ]
        )

    @classmethod
    def from_config(
        cls,
        config: RunConfig,
        proxy: TitoProxy,
        *,
        base_url: str,
        max_concurrent: int,
        task_ids: Collection[str] | None = None,
    ) -> ExternalRollout:
        """The gateway of a run: `config.gateway`, workspaces where the harness would put them
        (`tasks.harness.workspace_root`, default `<run_dir>/executions`), the harness's verifier
        limits; the admin token from the config, else `$GYRE_GATEWAY_TOKEN`, else a random one
        (printed)."""
        harness = config.tasks.harness
        run_dir = Path(config.run_dir).resolve()
        token = config.gateway.admin_token or os.environ.get(TOKEN_ENV, "")
        if not token:
            token = secrets.token_urlsafe(24)
            print(f"gateway: admin token {token} (set gateway.admin_token or ${TOKEN_ENV})")
        return cls(
            proxy,
            config=config.gateway,
            base_url=base_url,
            model=config.proxy.model_name,
            workspace_root=harness.workspace_root or run_dir / "executions",
            admin_token=token,
            verifier_limits=Limits(
                memory_bytes=harness.memory_bytes,
                file_size_bytes=harness.file_size_bytes,
                max_processes=harness.max_processes,
            ),
            max_concurrent=max_concurrent,
            task_ids=task_ids,
            keep_workspaces=harness.keep_workspaces,
        )

    # -- the driver's side ---------------------------------------------------------------------

    async def run(self, task: Task, execution_id: str) -> Executed:
        """Publish one execution of `task` and return it once it ended: closed by its agent loop
        (`finished`), closed by gyre at its deadline or a limit (`timeout`, `turn_limit`,
        `token_budget`; partially scored), or `failed` (never claimed, no model call, no sampled
        token, verifier failure). Never raises for the execution's failure. Raises `ValueError`
        for an execution id `check_execution_id` rejects or one already published."""
        check_execution_id(execution_id)
        if execution_id in self._live or execution_id in self._ended:
            raise ValueError(f"execution {execution_id!r} was already published")
        async with self.limiter:
            key = self.proxy.mint_key(execution_id)
            ex = _External(task=task, execution_id=execution_id, key=key)
            self._live[execution_id] = ex
            self._pending[execution_id] = ex
            self._published.set()
            self._published = anyio.Event()
            try:
                termination = await self._wait_end(ex)
            except BaseException:  # the run is stopping: end it in the proxy, unscored
                with anyio.CancelScope(shield=True):
                    await self._end(ex, None, reason="the run stopped before it ended")
                raise
            with anyio.CancelScope(shield=True):  # scored once it is out of the proxy
                return await self._end(ex, termination)

    async def run_many(
        self,
        jobs: Sequence[tuple[Task, str]],
        on_done: Callable[[int, Executed], None] | None = None,
    ) -> list[Executed]:
        """Run `(task, execution_id)` jobs concurrently, as `Rollout.run_many`."""
        return await run_jobs(self.run, jobs, on_done)

    async def _wait_end(self, ex: _External) -> Termination | None:
        """Wait for the claim, then for the close, the deadline or a limit; returns how it ended
        (None: never claimed)."""
        with anyio.move_on_after(self.config.claim_timeout_s):
            await ex.claimed.wait()
        if not ex.claimed.is_set():
            return None
        limits = ex.task.spec.agent

        def refresh(control: ExecutionControl) -> None:
            s = self.proxy.summary(ex.execution_id)
            control.observe_totals(
                model_calls=s.num_calls,
                completion_tokens=s.completion_tokens,
                context_refusals=s.context_refusals,
            )

        control = ExecutionControl(
            max_turns=limits.max_turns, token_budget=limits.token_budget, refresh=refresh
        )
        end = anyio.current_time() + limits.deadline_s
        while not ex.close_asked.is_set():
            control.refresh()
            if control.reason is not None:  # a limit of the task: gyre closes it (the harness
                return control.reason  # kills its agent), then scores what it left
            left = end - anyio.current_time()
            if left <= 0:
                return "timeout"
            with anyio.move_on_after(min(_POLL_S, left)):
                await ex.close_asked.wait()
        return "finished"

    async def _end(
        self, ex: _External, termination: Termination | None, *, reason: str | None = None
    ) -> Executed:
        """Close the execution in the proxy, score it and return its `Executed` (call shielded).
        `termination` None: it ends `failed`, for `reason` (default: never claimed)."""
        if reason is not None:
            ex.failure = reason
        async with ex.lock:  # a verify in flight ends first
            ex.state = "closing"
            self._pending.pop(ex.execution_id, None)
            session = self.proxy.sessions.get(ex.execution_id)
            summary = await self.proxy.close(ex.execution_id)
            calls = session.calls() if session is not None else []
            outcome = await self._outcome(ex, termination, summary.num_calls, calls)
            ex.state, ex.outcome = "closed", outcome
            del self._live[ex.execution_id]
            self._ended[ex.execution_id] = (outcome, len(calls))
            ex.ended.set()
        if ex.exec_dir is not None and not self.keep_workspaces:
            exec_dir = ex.exec_dir
            await anyio.to_thread.run_sync(lambda: shutil.rmtree(exec_dir, ignore_errors=True))
        key = "failed" if outcome.failed else "stopped" if outcome.stopped else "finished"
        self._counts[key] += 1
        return Executed(outcome=outcome, calls=calls, summary=summary)

    async def _outcome(
        self, ex: _External, termination: Termination | None, num_calls: int, calls: list
    ) -> Outcome:
        tokens = sum(len(c.completion_ids) for c in calls)
        common: dict[str, Any] = dict(
            execution_id=ex.execution_id,
            task_id=ex.task.task_id,
            model_calls=num_calls,
            completion_tokens=tokens,
            started_s=ex.claimed_s,
            agent_s=time.time() - ex.claimed_s if ex.claimed_s else 0.0,
        )

        def failed(reason: str) -> Outcome:
            return Outcome(**common, termination="failed", failure_reason=reason)

        if ex.failure is not None:
            return failed(ex.failure)
        if termination is None:
            self._counts["unclaimed"] += 1
            return failed(
                f"no agent loop claimed it within gateway.claim_timeout_s="
                f"{self.config.claim_timeout_s:g} s"
            )
        # Nothing to train on: out of the loss and the group baseline (field case B20).
        if num_calls == 0:
            return failed(f"{termination} before its first model call")
        if tokens == 0:
            return failed(
                f"no policy tokens: all {num_calls} model calls ended before their first token"
            )
        score = ex.score
        if score is None:
            assert ex.exec_dir is not None
            try:
                score = await self._verify(ex)
            except VerifierError as exc:
                return failed(str(exc))
        return Outcome(**common, termination=termination, score=score)

    async def _verify(self, ex: _External) -> Score:
        assert ex.exec_dir is not None
        return await score_workspace(
            ex.task,
            ex.exec_dir / "workspace",
            limits=self.verifier_limits,
            template_ok=self._template_ok,
        )

    # -- the agent loop's side -----------------------------------------------------------------

    async def _claim(self, *, task_id: str | None = None, wait_s: float = 0.0) -> _External | None:
        """The oldest pending execution (of `task_id`, if given), claimed: its workspace is
        prepared and its deadline starts. Waits up to `wait_s` (capped at `max_claim_wait_s`) for
        one to be published; None if none was."""
        with anyio.move_on_after(min(wait_s, self.config.max_claim_wait_s)):
            while True:
                published = self._published
                ex = next(
                    (e for e in self._pending.values() if task_id in (None, e.task.task_id)), None
                )
                if ex is not None:
                    break
                await published.wait()
        if ex is None:
            return None
        del self._pending[ex.execution_id]
        ex.state = "open"
        ex.claimed_s = time.time()
        try:
            ex.exec_dir = await anyio.to_thread.run_sync(self._prepare, ex)
        except OSError as exc:
            ex.failure = f"cannot prepare the workspace: {exc}"
            ex.close_asked.set()  # ended as failed by `run`
            raise proxy_error(ex.failure, 500, "workspace_error") from None
        finally:
            ex.claimed.set()
        return ex

    def _prepare(self, ex: _External) -> Path:
        """`<workspace_root>/<execution_id>/`: `workspace/` (the task's `environment/`) and
        `instruction.md`, as the harness prepares them."""
        self.workspace_root.mkdir(parents=True, exist_ok=True)
        exec_dir = self.workspace_root / ex.execution_id
        exec_dir.mkdir(mode=0o700)
        shutil.copytree(ex.task.environment_dir, exec_dir / "workspace", symlinks=True)
        (exec_dir / "instruction.md").write_text(ex.task.instruction, encoding="utf-8")
        return exec_dir

    def statistics(self) -> GatewayStatistics:
        """Counters since this rollout was built."""
        c = self._counts
        return GatewayStatistics(
            pending=len(self._pending),
            running=sum(e.state == "open" for e in self._live.values()),
            finished=c["finished"],
            stopped=c["stopped"],
            failed=c["failed"],
            unclaimed=c["unclaimed"],
            rewards_posted=c["rewards_posted"],
            verifications=c["verifications"],
            requests_total=c["requests_total"],
            requests_refused=c["requests_refused"],
        )

    # -- HTTP ----------------------------------------------------------------------------------

    async def serve(
        self,
        *,
        host: str | None = None,
        port: int | None = None,
        task_status=anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve the execution API with Hypercorn in this event loop until cancelled; reports
        the bound port through `task_status`. Raises `OSError` when the address cannot be bound."""
        await serve_app(
            self.app,
            host=self.config.host if host is None else host,
            port=self.config.port if port is None else port,
            task_status=task_status,
        )

    def _error(self, exc: Exception) -> Response:
        self._counts["requests_refused"] += 1
        status, type_, code = 500, "server_error", None
        if isinstance(exc, GyreError):
            status, type_ = exc.http_status, exc.http_type
            code = exc.error_code if isinstance(exc, ProxyError) else exc.code
        if status == 500:
            logger.error("gateway request failed: %s", exc)
        return Response(
            error_body(str(exc), type=type_, code=code),
            status_code=status,
            media_type="application/json",
        )

    async def _admitted(self, request: Request, decoder: msgspec.json.Decoder | None) -> Any:
        """Check the admin token and read the body (decoded by `decoder`; empty: its defaults)."""
        self._counts["requests_total"] += 1
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
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > _MAX_BODY_BYTES:
                raise proxy_error(
                    f"request body over {_MAX_BODY_BYTES} bytes", 413, "request_too_large"
                )
        if decoder is None:
            return None
        try:
            return decoder.decode(body or b"{}")
        except msgspec.ValidationError as exc:
            raise proxy_error(f"invalid request: {exc}", 400, "invalid_request") from None
        except msgspec.DecodeError as exc:
            raise proxy_error(f"the body is not JSON: {exc}", 400, "invalid_json") from None

    def _open(self, execution_id: str) -> _External:
        """The claimed, not yet closing execution `execution_id`; 404 when gyre never published
        it, 409 when it is pending, closing or closed."""
        ex = self._live.get(execution_id)
        if ex is None:
            if execution_id in self._ended:
                raise proxy_error(f"execution {execution_id!r} is closed", 409, "execution_closed")
            raise proxy_error(
                f"no execution {execution_id!r} in this run", 404, "execution_not_found"
            )
        if ex.state == "pending":
            raise proxy_error(
                f"execution {execution_id!r} is pending: claim it first", 409, "not_claimed"
            )
        if ex.state != "open" or ex.close_asked.is_set():
            raise proxy_error(f"execution {execution_id!r} is closed", 409, "execution_closed")
        return ex

    async def _claim_route(self, request: Request) -> Response:
        try:
            req: _ClaimRequest = await self._admitted(request, _CLAIM_DECODER)
            if not (math.isfinite(req.wait_s) and req.wait_s >= 0):
                raise proxy_error(
                    f"wait_s={req.wait_s} must be a finite number >= 0",
                    400,
                    "invalid_request",
                    param="wait_s",
                )
            if req.task_id is not None and self.task_ids is not None:
                if req.task_id not in self.task_ids:
                    raise proxy_error(
                        f"task {req.task_id!r} is not one of this run's tasks",
                        404,
                        "task_not_found",
                        param="task_id",
                    )
            ex = await self._claim(task_id=req.task_id, wait_s=req.wait_s)
        except ProxyError as exc:
            return self._error(exc)
        if ex is None:
            return Response(status_code=204)
        assert ex.exec_dir is not None
        limits = ex.task.spec.agent
        root = self.base_url.removesuffix("/v1")
        body = {
            "execution_id": ex.execution_id,
            "api_key": ex.key,
            "base_url": self.base_url,
            "anthropic_base_url": root,
            "model": self.model,
            "task": {
                "id": ex.task.task_id,
                "instruction": ex.task.instruction,
                "workspace": str(ex.exec_dir / "workspace"),
                "instruction_file": str(ex.exec_dir / "instruction.md"),
            },
            "limits": {
                "deadline_s": limits.deadline_s,
                "max_turns": limits.max_turns,
                "token_budget": limits.token_budget,
            },
            "deadline_unix_s": ex.claimed_s + limits.deadline_s,
        }
        location = f"/gyre/v1/executions/{ex.execution_id}"
        return _json(body, 201, headers={"location": location})

    async def _list_route(self, request: Request) -> Response:
        try:
            await self._admitted(request, None)
        except ProxyError as exc:
            return self._error(exc)
        return _json(
            {
                "pending": [
                    {"execution_id": e.execution_id, "task_id": e.task.task_id}
                    for e in self._pending.values()
                ],
                "open": [
                    {"execution_id": e.execution_id, "task_id": e.task.task_id}
                    for e in self._live.values()
                    if e.state == "open"
                ],
                "statistics": self.statistics(),
            }
        )

    async def _reward_route(self, request: Request) -> Response:
        try:
            req: _RewardRequest = await self._admitted(request, _REWARD_DECODER)
            ex = self._open(request.path_params["execution_id"])
            if not (math.isfinite(req.reward) and 0.0 <= req.reward <= 1.0):
                raise proxy_error(
                    f"reward={req.reward} must be a finite number in [0, 1]",
                    400,
                    "invalid_reward",
                    param="reward",
                )
            if ex.score is not None or ex.lock.locked():
                raise proxy_error(
                    f"execution {ex.execution_id!r} already has a reward (or is being verified)",
                    409,
                    "reward_exists",
                )
            passed = req.reward == 1.0 if req.passed is None else req.passed
            ex.score = Score(passed=int(passed), total=1, score=req.reward, all_passed=passed)
            self._counts["rewards_posted"] += 1
        except ProxyError as exc:
            return self._error(exc)
        return _json({"execution_id": ex.execution_id, "reward": req.reward, "passed": passed})

    async def _verify_route(self, request: Request) -> Response:
        try:
            await self._admitted(request, None)
            ex = self._open(request.path_params["execution_id"])
            if ex.score is not None or ex.lock.locked():
                raise proxy_error(
                    f"execution {ex.execution_id!r} already has a reward (or is being verified)",
                    409,
                    "reward_exists",
                )
            async with ex.lock:
                self._open(ex.execution_id)  # not closed by gyre meanwhile
                self._counts["verifications"] += 1
                score = ex.score = await self._verify(ex)
        except (ProxyError, VerifierError) as exc:
            return self._error(exc)
        return _json(
            {
                "execution_id": ex.execution_id,
                "reward": score.score,
                "passed": score.all_passed,
                "tests_passed": score.passed,
                "tests_total": score.total,
            }
        )

    async def _close_route(self, request: Request) -> Response:
        try:
            await self._admitted(request, None)
            ex = self._open(request.path_params["execution_id"])
            ex.close_asked.set()
            await ex.ended.wait()
        except ProxyError as exc:
            return self._error(exc)
        assert ex.outcome is not None
        return _json(_outcome_body(ex.outcome, self._ended[ex.execution_id][1]))


@asynccontextmanager
async def open_gateway(
    config: RunConfig, proxy: TitoProxy, *, base_url: str, max_concurrent: int
) -> AsyncIterator[ExternalRollout]:
    """The run's `ExternalRollout` (`ExternalRollout.from_config`, claims limited to the tasks of
    `config.tasks.suites`) with its execution API served on `gateway.host:port`; its address and
    the proxy's are written to `<run_dir>/gateway.json` (`url`, `base_url`; never the token)
    and printed. Stops serving on exit."""
    task_ids = [t.task_id for suite in config.tasks.suites for t in load_suite(suite)]
    rollout = ExternalRollout.from_config(
        config, proxy, base_url=base_url, max_concurrent=max_concurrent, task_ids=task_ids
    )
    async with anyio.create_task_group() as tg:
        port = await tg.start(rollout.serve)
        url = f"http://{config.gateway.host}:{port}/gyre/v1"
        run_dir = Path(config.run_dir).resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "gateway.json").write_bytes(_ENCODER.encode({"url": url, "base_url": base_url}))
        print(f"gateway: execution API at {url}/executions, proxy at {base_url}", flush=True)
        yield rollout
        tg.cancel_scope.cancel()


async def serve_app(
    app: Any, *, host: str, port: int, task_status=anyio.TASK_STATUS_IGNORED
) -> None:
    """Serve the ASGI `app` with Hypercorn on `host:port` (0: a free port) in this event loop
    (trio or asyncio) until cancelled; reports the bound port through `task_status`."""
    import sniffio
    from hypercorn.config import Config as HypercornConfig

    if sniffio.current_async_library() == "trio":
        from hypercorn.trio import serve as hypercorn_serve
    else:
        from hypercorn.asyncio import serve as hypercorn_serve
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        bound = sock.getsockname()[1]
    except BaseException:
        sock.close()
        raise
    hc = HypercornConfig()
    hc.bind = [f"fd://{sock.detach()}"]
    hc.accesslog = None
    hc.errorlog = logger
    hc.graceful_timeout = 1.0
    shutdown = anyio.Event()

    async def run_server() -> None:
        with anyio.CancelScope(
            shield=True
        ):  # Hypercorn stops through its trigger (TitoProxy.serve)
            await hypercorn_serve(app, hc, shutdown_trigger=shutdown.wait, mode="asgi")

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_server)
        task_status.started(bound)
        try:
            await anyio.sleep_forever()
        finally:
            shutdown.set()
