"""Redirection: driving one request's choices through attempts ("legs") across cells.

Owns the per-request state (`RequestState`, `Choice`, `Leg`) and `Redirector`, which runs each
choice as a chain of n=1 attempts. An attempt stopped on its member (the cell left rollout, died,
or stalled for `attempt_timeout_s`) keeps its tokens so far; the choice continues on the next
member from prompt + tokens so far, max_tokens reduced and a seed derived per attempt
(`choice_seed`), through the `Continuation` seam (KV migrated or recomputed), so the caller sees one
uninterrupted stream whose tokens carry the versions that sampled them (field case B11). Counts
what it did and what it recovered from (`RedirectStatistics`: a member that fails to abort is
logged once and marked down); every wait is bounded by `RouterConfig`.

Knows nothing about which cells exist, their roles or session affinity: the router hands it
`place` (the member for a choice's next attempt) and `mark_down`, and drains a member by `stop_leg`.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Generic, Literal, Protocol, TypeVar, cast

import anyio
import msgspec

from gyre._counters import Counters
from gyre.config import RouterConfig
from gyre.engines.protocol import (
    Completion,
    FinishReason,
    GenerateRequest,
    InferenceEngine,
    TokenDelta,
    choice_seed,
)
from gyre.errors import EngineError, EngineTimeoutError, EngineUnavailableError, InvalidRequestError
from gyre.routing.continuation import Continuation, ContinuationPlan

__all__ = [
    "Choice",
    "Leg",
    "Member",
    "Redirector",
    "RedirectStatistics",
    "RequestState",
    "Signal",
    "StopReason",
]

logger = logging.getLogger(__name__)

StopReason = Literal["redirect", "timeout", "user"]
"""Why an attempt was stopped: its member left rollout (`redirect`), no token came for
`attempt_timeout_s` (`timeout`), or the caller aborted the request (`user`)."""


class Signal:
    """A condition to wait for: `notify()` wakes every waiter of `wait()` (no lost wake-ups, since
    checking the condition and calling `wait()` happen without a checkpoint in between)."""

    def __init__(self) -> None:
        self._event: anyio.Event | None = None

    def notify(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = None

    async def wait(self) -> None:
        if self._event is None:
            self._event = anyio.Event()
        await self._event.wait()


class Member(Protocol):
    """What an attempt needs of the router member (one cell) it runs on."""

    name: str
    engine: InferenceEngine
    legs: set[Leg]
    """Attempts in flight on the member; a drain waits until it is empty."""
    legs_changed: Signal
    """Notified whenever an attempt leaves `legs`."""


class Leg:
    """One attempt of one choice on one member (an n=1 request with its own ID)."""

    def __init__(self, member: Member, request_id: str) -> None:
        self.member = member
        self.request_id = request_id
        self.scope = anyio.CancelScope()
        self.ended = anyio.Event()
        self.stop_reason: StopReason | None = None
        self.stopped_s: float | None = None
        self.abort_sent = False
        self.abort_result: list[Completion] | None = None
        self.finish: FinishReason | None = None
        self.cached: int | None = None
        self.error: EngineError | None = None
        self.streamed = 0
        self.last_token_s = anyio.current_time()


class Choice:
    """One choice of a request across all its attempts: the tokens the caller has been given."""

    def __init__(self, index: int, max_tokens: int) -> None:
        self.index = index
        self.max_tokens = max_tokens
        self.ids: list[int] = []
        self.lps: list[float] = []
        self.vers: list[int] = []
        self.top_ids: list[list[int]] = []
        self.top_lps: list[list[float]] = []
        """Per token, the k most likely IDs and their logprobs (`SamplingParams.top_logprobs`)."""
        self.finish: FinishReason | None = None
        self.cached: int | None = None
        self.leg: Leg | None = None
        self.user_aborted = False
        self.moved_s: float | None = None
        self.done = anyio.Event()

    def completion(self) -> Completion:
        return Completion(
            index=self.index,
            token_ids=list(self.ids),
            logprobs=list(self.lps),
            versions=list(self.vers),
            finish_reason=self.finish or "abort",
            top_ids=list(self.top_ids) if self.top_ids else None,
            top_logprobs=list(self.top_lps) if self.top_lps else None,
        )


class RequestState:
    """One request in flight: its choices, the stream to its caller (`send` / `receive`), the scope
    its choices run in, and `served`, set once no attempt of it runs anywhere."""

    def __init__(self, request: GenerateRequest, session: str, max_tokens: int) -> None:
        self.request = request
        self.session = session
        self.choices = [Choice(i, max_tokens) for i in range(request.sampling.n)]
        self.scope = anyio.CancelScope()
        self.served = anyio.Event()
        self.send, self.receive = anyio.create_memory_object_stream[TokenDelta | Exception](
            math.inf
        )


class RedirectStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Counters of a `Redirector` (docs/style.md rule 6); `RouterStatistics` documents each
    field."""

    tokens_generated: int
    requests_routed: int
    requests_redirected: int
    requests_retried: int
    tokens_recomputed: int
    requests_migrated: int
    tokens_migrated: int
    migrations_missed: int
    aborts_failed: int
    redirect_latency_s_mean: float
    """Mean time from a choice leaving its member to its first token on the next one, seconds
    (for a held choice, from the end of its hold: a suspension is not a slow redirect)."""
    redirect_latency_s_max: float
    """Longest such time, seconds."""


M = TypeVar("M", bound=Member)


class Redirector(Generic[M]):
    """Runs choices as chains of attempts over members (see the module docstring).

    Args:
        config: timeouts and retry limit (`attempt_timeout_s`, `abort_timeout_s`,
            `request_timeout_s`, `max_retries`).
        continuation: how a choice continues on another member (KV migrated or recomputed).
        place: `place(state, choice, avoid)` is the member for the choice's next attempt (not
            `avoid` if another serves), None once the caller aborted the choice; it raises
            `EngineUnavailableError` when none comes in time.
        mark_down: `mark_down(member, reason)` takes a member out of service (one whose attempt
            failed as unreachable, or that failed to abort an attempt).
    """

    def __init__(
        self,
        config: RouterConfig,
        continuation: Continuation,
        *,
        place: Callable[[RequestState, Choice, M | None], Awaitable[M | None]],
        mark_down: Callable[[M, str], None],
    ) -> None:
        self.config = config
        self.continuation = continuation
        self._place = place
        self._mark_down = mark_down
        self._counts = Counters(
            "tokens_generated",
            "requests_routed",
            "requests_redirected",
            "requests_retried",
            "tokens_recomputed",
            "requests_migrated",
            "tokens_migrated",
            "migrations_missed",
            "aborts_failed",
        )
        self._latency_total_s = 0.0
        self._latency_max_s = 0.0
        self._latency_count = 0

    def statistics(self) -> RedirectStatistics:
        """A snapshot of the counters."""
        n = self._latency_count
        return RedirectStatistics(
            redirect_latency_s_mean=self._latency_total_s / n if n else 0.0,
            redirect_latency_s_max=self._latency_max_s,
            **self._counts,
        )

    async def run_choice(self, state: RequestState, choice: Choice) -> None:
        """Drive one choice to its end and hand the caller its final delta, or its error
        (`EngineTimeoutError` after `request_timeout_s`, or what `_drive` raised). Never raises."""
        rid = state.request.request_id
        try:
            try:
                with anyio.move_on_after(self.config.request_timeout_s) as deadline:
                    finish = await self._drive(state, choice)
                if deadline.cancelled_caught:
                    raise EngineTimeoutError(
                        f"request {rid!r} choice {choice.index}: not finished within "
                        f"request_timeout_s={self.config.request_timeout_s} "
                        f"({len(choice.ids)} tokens so far)"
                    )
            except Exception as exc:  # handed to the caller, who re-raises it
                _send(state, exc)
                return
            choice.finish = finish
            _send(
                state,
                TokenDelta(
                    index=choice.index,
                    token_ids=[],
                    logprobs=[],
                    versions=[],
                    finish_reason=finish,
                    cached_tokens=choice.cached,
                ),
            )
        finally:
            choice.done.set()

    async def _drive(self, state: RequestState, choice: Choice) -> FinishReason:
        """Run attempts of one choice until it finishes; returns its finish reason."""
        request = state.request
        sampling = request.sampling
        stop_ids = set(sampling.stop_token_ids)
        attempt = failures = 0
        avoid: M | None = None
        source: InferenceEngine | None = None
        carried: object = None
        while True:
            if choice.user_aborted:
                return "abort"
            if choice.ids and choice.ids[-1] in stop_ids:
                return "stop"  # the stop token came with an abort: the choice is complete
            remaining = choice.max_tokens - len(choice.ids)
            if remaining <= 0:
                return "length"
            member = await self._place(state, choice, avoid)
            if member is None:
                return "abort"
            seed = choice_seed(sampling.seed, choice.index)
            if seed is not None and attempt:
                seed = choice_seed(seed, attempt)  # a continuation is not a replay
            sub = GenerateRequest(
                request_id=f"{request.request_id}@{choice.index}.{attempt}",
                prompt_ids=[*request.prompt_ids, *choice.ids],
                sampling=msgspec.structs.replace(sampling, n=1, max_tokens=remaining, seed=seed),
            )
            leg = Leg(member, sub.request_id)
            member.legs.add(leg)  # from here a drain or an abort reaches it
            choice.leg = leg
            self._counts["requests_routed"] += 1
            plan: ContinuationPlan | None = None
            try:
                try:
                    if attempt:
                        plan = await self.continuation.prepare(
                            sub, source=source, target=member.engine, carried=carried
                        )
                        carried = None
                        sub = plan.request
                        self._counts["tokens_recomputed"] += plan.tokens_recomputed
                    await self._run_leg(state, choice, leg, sub, first=attempt == 0)
                except EngineError as exc:  # from the continuation strategy: a failed attempt
                    leg.error = exc
                leg.ended.set()
                if _continues(choice, leg, stop_ids):  # still registered here: a drain waits for it
                    so_far = msgspec.structs.replace(
                        sub, prompt_ids=[*request.prompt_ids, *choice.ids], kv_import=None
                    )
                    carried = await self.continuation.leave(so_far, source=member.engine)
            finally:
                leg.ended.set()
                member.legs.discard(leg)
                choice.leg = None
                member.legs_changed.notify()
                if plan is not None:
                    with anyio.CancelScope(shield=True):
                        loaded = await self.continuation.release(
                            plan, target=member.engine, cached_tokens=leg.cached
                        )
                    self._count_migration(plan, loaded)
            attempt += 1
            source, avoid = member.engine, None
            if leg.finish in ("stop", "length"):
                return leg.finish
            if choice.user_aborted:
                return "abort"
            if isinstance(leg.error, InvalidRequestError):
                raise leg.error
            if leg.stop_reason == "redirect" or isinstance(leg.error, EngineUnavailableError):
                if isinstance(leg.error, EngineUnavailableError) and leg.stop_reason != "redirect":
                    self._mark_down(member, f"attempt {leg.request_id!r} failed: {leg.error}")
                self._counts["requests_redirected"] += 1
                choice.moved_s = (
                    leg.stopped_s if leg.stopped_s is not None else anyio.current_time()
                )
                continue
            failures += 1
            self._counts["requests_retried"] += 1
            if failures > self.config.max_retries:
                why = leg.error or (
                    f"no token for attempt_timeout_s={self.config.attempt_timeout_s}"
                    if leg.stop_reason == "timeout"
                    else f"ended with finish reason {leg.finish!r}"
                )
                raise EngineUnavailableError(
                    f"request {request.request_id!r} choice {choice.index}: "
                    f"{failures} failed attempts "
                    f"(max_retries={self.config.max_retries}); last on cell {member.name!r}: {why}"
                )
            avoid = member

    def _count_migration(self, plan: ContinuationPlan, loaded: int) -> None:
        """Count a continuation as migrated only when its target loaded the KV (`loaded` tokens,
        from `Continuation.release`); one handed an export it did not load prefilled it."""
        if loaded:
            self._counts["requests_migrated"] += 1
            self._counts["tokens_migrated"] += loaded
        elif plan.tokens_loaded:
            self._counts["migrations_missed"] += 1
            self._counts["tokens_recomputed"] += plan.tokens_loaded

    # -- attempts -------------------------------------------------------------------------------

    async def _run_leg(
        self, state: RequestState, choice: Choice, leg: Leg, sub: GenerateRequest, *, first: bool
    ) -> None:
        """Stream one attempt into the choice; on return the attempt has ended on its member (or
        the member could not be reached within `abort_timeout_s`)."""
        engine = leg.member.engine
        if choice.user_aborted:  # aborted by the caller while the attempt was being prepared
            leg.abort_sent = True
            return
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch, leg)
                with leg.scope:
                    try:
                        async with contextlib.aclosing(engine.generate(sub)) as stream:
                            async for delta in stream:
                                self._take(
                                    state,
                                    choice,
                                    leg,
                                    delta.token_ids,
                                    delta.logprobs,
                                    delta.versions,
                                    delta.top_ids,
                                    delta.top_logprobs,
                                )
                                if delta.finish_reason is not None:
                                    leg.finish = delta.finish_reason
                                    leg.cached = delta.cached_tokens
                                    if first:
                                        choice.cached = delta.cached_tokens
                    except EngineError as exc:
                        leg.error = exc
                tg.cancel_scope.cancel()
        finally:
            if leg.finish is None and not leg.abort_sent:
                # the stream broke, or the caller went away: stop the attempt on its member first
                with anyio.CancelScope(shield=True):
                    await self._abort_leg(leg)
            leg.ended.set()
        if leg.finish is None and leg.abort_result:
            done = leg.abort_result[0]  # what the member sampled that its stream did not bring
            tail = slice(leg.streamed, None)
            self._take(
                state,
                choice,
                leg,
                done.token_ids[tail],
                done.logprobs[tail],
                done.versions[tail],
                None if done.top_ids is None else done.top_ids[tail],
                None if done.top_logprobs is None else done.top_logprobs[tail],
            )
            if done.finish_reason != "abort":
                leg.finish = done.finish_reason

    def _take(
        self,
        state: RequestState,
        choice: Choice,
        leg: Leg,
        ids: list[int],
        lps: list[float],
        vers: list[int],
        top_ids: list[list[int]] | None = None,
        top_lps: list[list[float]] | None = None,
    ) -> None:
        """Pass a delta of an attempt on to the caller, top-k entries included."""
        if not ids:
            return
        now = anyio.current_time()
        if choice.moved_s is not None:
            latency = now - choice.moved_s
            self._latency_total_s += latency
            self._latency_max_s = max(self._latency_max_s, latency)
            self._latency_count += 1
            choice.moved_s = None
        choice.ids += ids
        choice.lps += lps
        choice.vers += vers
        if top_ids is not None and top_lps is not None:
            choice.top_ids += top_ids
            choice.top_lps += top_lps
        leg.streamed += len(ids)
        leg.last_token_s = now
        self._counts["tokens_generated"] += len(ids)
        _send(
            state,
            TokenDelta(
                index=choice.index,
                token_ids=list(ids),
                logprobs=list(lps),
                versions=list(vers),
                top_ids=None if top_ids is None else list(top_ids),
                top_logprobs=None if top_lps is None else list(top_lps),
            ),
        )

    async def _watch(self, leg: Leg) -> None:
        """Stop the attempt if no token arrives for `attempt_timeout_s` (it is retried
        elsewhere)."""
        while (wake := leg.last_token_s + self.config.attempt_timeout_s) > anyio.current_time():
            await anyio.sleep(wake - anyio.current_time())
        await self.stop_leg(leg, "timeout")

    async def stop_leg(self, leg: Leg, reason: StopReason) -> None:
        """Abort an attempt on its member and wait (at most `abort_timeout_s` for the abort, as long
        again for the stream) for its stream to end with the tokens so far. Never raises."""
        if leg.stop_reason is None:
            leg.stop_reason = reason
            leg.stopped_s = anyio.current_time()
        if leg.ended.is_set():
            return
        if not leg.abort_sent:
            await self._abort_leg(leg)
        with anyio.move_on_after(self.config.abort_timeout_s):
            await leg.ended.wait()
        leg.scope.cancel()  # the stream did not end: stop listening (no-op once it has ended)

    async def _abort_leg(self, leg: Leg) -> None:
        """`engine.abort` on the attempt's member, at most `abort_timeout_s`; keeps what it
        returns. A member that cannot abort (it raised `EngineError` or did not answer in time) is
        no longer listened to (the tokens so far are what its stream brought), is marked down (the
        attempt may still run there) and is counted in `aborts_failed`, with one warning.

        Shielded (it is bounded by `abort_timeout_s` itself): once `abort_sent` is set no other
        path sends the abort, so one cancelled here would leave the cell sampling until the
        attempt's stream is given up on."""
        leg.abort_sent = True
        try:
            with anyio.CancelScope(shield=True), anyio.fail_after(self.config.abort_timeout_s):
                leg.abort_result = await leg.member.engine.abort(leg.request_id)
        except (EngineError, TimeoutError) as exc:  # recovered: counted, the member marked down
            leg.scope.cancel()
            why = (
                str(exc)
                if isinstance(exc, EngineError)
                else (f"no answer within abort_timeout_s={self.config.abort_timeout_s}")
            )
            self._counts["aborts_failed"] += 1
            logger.warning(
                "abort of attempt %r on cell %r failed (%s): the cell is marked down",
                leg.request_id,
                leg.member.name,
                why,
            )
            # an M: every leg is made by `_run_leg` on a member that `place` returned
            member = cast(M, leg.member)
            self._mark_down(member, f"abort of attempt {leg.request_id!r} failed: {why}")


def _continues(choice: Choice, leg: Leg, stop_ids: set[int]) -> bool:
    """Whether a choice goes on to another attempt after `leg` ended (see `Redirector._drive`)."""
    if (
        leg.finish in ("stop", "length")
        or choice.user_aborted
        or isinstance(leg.error, InvalidRequestError)
    ):
        return False
    if choice.ids and choice.ids[-1] in stop_ids:
        return False
    return len(choice.ids) < choice.max_tokens


def _send(state: RequestState, item: TokenDelta | Exception) -> None:
    """Hand an item to the request's caller (no checkpoint); nothing to do once the caller left."""
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        state.send.send_nowait(item)
