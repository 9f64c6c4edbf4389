"""External executions: the run's executions handed to agent loops run elsewhere.

Owns `ExternalRollout` (the rollout of the gateway: same contract as `Rollout`, `run(task,
execution_id) -> Executed`), `Claimed`, `ClaimedTask`, `GatewayStatistics` and `check_gateway`.
When the driver asks for an execution, it is published as pending (its proxy key minted); an
agent loop claims it (`claim`: its key, the proxy's base URLs, the task and a workspace gyre
prepared), runs its own agent against the TITO proxy, posts a reward (`post_reward`) or has the
task's sealed verifier score the workspace (`verify`), and closes it (`close`). An execution not
closed by its task's deadline, or past its turn or token limit, is closed by gyre and scored on
what its workspace holds (partial scoring, as the harness does); one no loop claims within
`gateway.claim_timeout_s` fails. Bad calls raise `ProxyError` with their 4xx and change nothing.
The HTTP routes over these operations are `gyre.rollout.gateway_api`. Knows nothing about
trees, training, HTTP or what the agent loop runs.
"""

from __future__ import annotations

import collections
import math
import os
import shutil
import socket
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import msgspec

from gyre._counters import Counters
from gyre.agents.control import ExecutionControl, check_execution_id
from gyre.config import GatewayConfig, RunConfig
from gyre.errors import ConfigError, VerifierError
from gyre.rollout.source import Executed, FailureStreak, run_jobs
from gyre.sandbox import Limits
from gyre.tasks.outcome import Outcome, Score, Termination
from gyre.tasks.scorer import score_workspace
from gyre.tasks.task import AgentLimits, Task
from gyre.tito.openai_requests import proxy_error
from gyre.tito.proxy import TitoProxy

__all__ = [
    "ExternalRollout",
    "Claimed",
    "ClaimedTask",
    "GatewayStatistics",
    "check_gateway",
]


_POLL_S = 0.05
"""How often an open execution's limits are checked against the proxy's totals."""


class ClaimedTask(msgspec.Struct, frozen=True, kw_only=True):
    """The task of a claimed execution, as its agent loop sees it."""

    id: str
    instruction: str
    workspace: str
    """Absolute path of the execution's workspace (a copy of the task's `environment/`): the
    verifier scores what it holds at the end."""
    instruction_file: str
    """Absolute path of `instruction.md` beside the workspace."""


class Claimed(msgspec.Struct, frozen=True, kw_only=True):
    """What an agent loop gets when it claims an execution (the body of the 201)."""

    execution_id: str
    api_key: str
    """The execution's key for the proxy (`Authorization: Bearer` or `x-api-key`)."""
    base_url: str
    """The proxy's base URL for OpenAI clients (`http://host:port/v1`)."""
    anthropic_base_url: str
    """The same without `/v1`: Anthropic's SDK appends `/v1/messages` itself."""
    model: str
    """The served model name."""
    task: ClaimedTask
    limits: AgentLimits
    """The task's `deadline_s` (from the claim), `max_turns` and `token_budget`."""
    deadline_unix_s: float
    """Unix time past which gyre closes the execution and scores its workspace."""


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
    """Refuse, before a run starts, what the gateway cannot do: `require_isolation` (true by
    default; agent loops run outside gyre's sandbox, so a gateway run says
    `tasks.harness.require_isolation = false`) and an execution API address that cannot be bound.
    Raises `ConfigError` naming the keys; nothing when `[gateway]` is off."""
    gw = config.gateway
    if not gw.enabled:
        return
    if config.tasks.harness.require_isolation:
        raise ConfigError(
            "gateway.enabled with tasks.harness.require_isolation = true (the default): agent "
            "loops of the gateway run outside gyre's sandbox, so their isolation cannot be "
            "required; set tasks.harness.require_isolation = false"
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
        max_consecutive_failures: `FailureStreak`'s limit (0: a failure streak never raises).

    Its HTTP routes: `gyre.rollout.gateway_api.ExecutionApi`.
    """

    def __init__(
        self,
        proxy: TitoProxy,
        *,
        config: GatewayConfig,
        base_url: str,
        model: str,
        workspace_root: str | os.PathLike[str],
        verifier_limits: Limits = Limits(),
        max_concurrent: int,
        task_ids: Collection[str] | None = None,
        keep_workspaces: bool = False,
        max_consecutive_failures: int = 0,
    ) -> None:
        self.proxy = proxy
        self.config = config
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.workspace_root = Path(workspace_root)
        self.verifier_limits = verifier_limits
        self.limiter = anyio.CapacityLimiter(max_concurrent)
        self.task_ids = None if task_ids is None else frozenset(task_ids)
        self.keep_workspaces = keep_workspaces
        self._pending: collections.OrderedDict[str, _External] = collections.OrderedDict()
        self._live: dict[str, _External] = {}
        """Every execution published and not ended (pending ones too)."""
        self._ended: dict[str, Outcome] = {}
        """Ended executions' outcomes (a late request gets 409, not 404)."""
        self._published = anyio.Event()
        """Set (and replaced) whenever an execution is published: wakes waiting claims."""
        self._template_ok: dict[str, bool] = {}
        self._counts = Counters(
            "finished",
            "stopped",
            "failed",
            "unclaimed",
            "rewards_posted",
            "verifications",
            "requests_total",
            "requests_refused",
        )
        self.streak = FailureStreak(max_consecutive_failures)

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
        limits."""
        harness = config.tasks.harness
        run_dir = Path(config.run_dir).resolve()
        return cls(
            proxy,
            config=config.gateway,
            base_url=base_url,
            model=config.proxy.model_name,
            workspace_root=harness.workspace_root or run_dir / "executions",
            verifier_limits=Limits(
                memory_bytes=harness.memory_bytes,
                file_size_bytes=harness.file_size_bytes,
                max_processes=harness.max_processes,
            ),
            max_concurrent=max_concurrent,
            task_ids=task_ids,
            keep_workspaces=harness.keep_workspaces,
            max_consecutive_failures=config.loop.max_consecutive_failures,
        )

    # -- the driver's side ---------------------------------------------------------------------

    async def run(self, task: Task, execution_id: str) -> Executed:
        """Publish one execution of `task` and return it once it ended: closed by its agent loop
        (`finished`), closed by gyre at its deadline or a limit (`timeout`, `turn_limit`,
        `token_budget`; partially scored), or `failed` (never claimed, no model call, no sampled
        token, verifier failure). Raises `ExecutionError` when its failure trips the streak
        (`FailureStreak`: `max_consecutive_failures` in a row over two tasks or more, e.g. no loop
        claimed any), `ValueError` for an execution id `check_execution_id` rejects or one already
        published."""
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
                executed = await self._end(ex, termination)
        self.streak.observe(executed.outcome)
        return executed

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
            summary, calls = await self.proxy.end(ex.execution_id)
            outcome = await self._outcome(ex, termination, summary.num_calls, calls)
            ex.state, ex.outcome = "closed", outcome
            del self._live[ex.execution_id]
            self._ended[ex.execution_id] = outcome
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

    async def claim(self, *, task_id: str | None = None, wait_s: float = 0.0) -> Claimed | None:
        """Claim the oldest pending execution (of `task_id`, if given): its workspace is prepared
        and its deadline starts. Waits up to `wait_s` (capped at `max_claim_wait_s`) for one to be
        published; None if none was. Raises `ProxyError`: 400 for a `wait_s` that is not a finite
        number >= 0, 404 for a `task_id` that is not one of the run's, 500 when the workspace
        cannot be prepared (the execution then ends `failed`)."""
        if not (math.isfinite(wait_s) and wait_s >= 0):
            raise proxy_error(
                f"wait_s={wait_s} must be a finite number >= 0",
                400,
                "invalid_request",
                param="wait_s",
            )
        if task_id is not None and self.task_ids is not None and task_id not in self.task_ids:
            raise proxy_error(
                f"task {task_id!r} is not one of this run's tasks",
                404,
                "task_not_found",
                param="task_id",
            )
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
            exec_dir = ex.exec_dir = await anyio.to_thread.run_sync(self._prepare, ex)
        except OSError as exc:
            ex.failure = f"cannot prepare the workspace: {exc}"
            ex.close_asked.set()  # ended as failed by `run`
            raise proxy_error(ex.failure, 500, "workspace_error") from None
        finally:
            ex.claimed.set()
        limits = ex.task.spec.agent
        return Claimed(
            execution_id=ex.execution_id,
            api_key=ex.key,
            base_url=self.base_url,
            anthropic_base_url=self.base_url.removesuffix("/v1"),
            model=self.model,
            task=ClaimedTask(
                id=ex.task.task_id,
                instruction=ex.task.instruction,
                workspace=str(exec_dir / "workspace"),
                instruction_file=str(exec_dir / "instruction.md"),
            ),
            limits=limits,
            deadline_unix_s=ex.claimed_s + limits.deadline_s,
        )

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
        return GatewayStatistics(
            pending=len(self._pending),
            running=sum(e.state == "open" for e in self._live.values()),
            **self._counts,
        )

    def note_request(self, *, refused: bool) -> None:
        """Count one request to the execution API (`statistics`)."""
        self._counts["requests_total"] += 1
        self._counts["requests_refused"] += refused

    def listing(self) -> dict[str, list[dict[str, str]]]:
        """The pending and the open (claimed) executions: `execution_id` and `task_id` each."""

        def rows(executions) -> list[dict[str, str]]:
            return [{"execution_id": e.execution_id, "task_id": e.task.task_id} for e in executions]

        return {
            "pending": rows(self._pending.values()),
            "open": rows(e for e in self._live.values() if e.state == "open"),
        }

    def post_reward(self, execution_id: str, reward: float, passed: bool | None = None) -> Score:
        """Set the reward of a claimed execution: a `Score` of `reward` (in [0, 1]) with
        `all_passed = passed` (default: reward == 1). Raises `ProxyError`: 400 for a reward that
        is not a finite number in [0, 1], 404/409 as `_open`, 409 when it has a reward already
        or is being verified."""
        ex = self._open(execution_id)
        if not (math.isfinite(reward) and 0.0 <= reward <= 1.0):
            raise proxy_error(
                f"reward={reward} must be a finite number in [0, 1]",
                400,
                "invalid_reward",
                param="reward",
            )
        self._unscored(ex)
        passed = reward == 1.0 if passed is None else passed
        ex.score = Score(passed=int(passed), total=1, score=reward, all_passed=passed)
        self._counts["rewards_posted"] += 1
        return ex.score

    async def verify(self, execution_id: str) -> Score:
        """Run the task's sealed verifier on the workspace of a claimed execution now; its score
        is the execution's reward (once: the verifier is not an oracle to query). Raises
        `ProxyError` as `post_reward`, `VerifierError` when the verifier itself fails."""
        ex = self._open(execution_id)
        self._unscored(ex)
        async with ex.lock:
            self._open(execution_id)  # not closed by gyre meanwhile
            self._counts["verifications"] += 1
            ex.score = await self._verify(ex)
        return ex.score

    async def close(self, execution_id: str) -> Outcome:
        """End a claimed execution (its key stops working) and return its outcome, once scored:
        the posted reward, else the verifier's score of its workspace. Raises `ProxyError` as
        `_open` (a second close gets 409)."""
        ex = self._open(execution_id)
        ex.close_asked.set()
        await ex.ended.wait()
        assert ex.outcome is not None
        return ex.outcome

    def _unscored(self, ex: _External) -> None:
        if ex.score is not None or ex.lock.locked():
            raise proxy_error(
                f"execution {ex.execution_id!r} already has a reward (or is being verified)",
                409,
                "reward_exists",
            )

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
