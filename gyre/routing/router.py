"""The router: cell membership and session-affine routing of generate requests over the rollout
cells.

Owns `Router` (itself an `InferenceEngine`; `Router.engine_for(execution_id)` gives the
per-execution view the TITO proxy asks for): request intake, replay of finished requests, aborts,
and its statistics (`RouterStatistics`). An execution's requests stay on one rollout cell while that
cell rolls out (prefix-cache reuse); a new execution goes to the least-loaded cell: the cells, their
roles and that placement are `gyre.routing.membership`. When a cell leaves rollout (`set_role`,
`drain`), dies (`EngineUnavailableError`) or stalls, its in-flight attempts move to other cells: the
driving of attempts is `gyre.routing.redirect`, how a choice continues there (KV migrated or
recomputed) is `gyre.routing.continuation`. A held (suspended) execution's attempts are stopped
with their tokens kept and its requests wait, unanswered, until a `pin` names its next cell
(`hold`). Every wait is bounded (`RouterConfig`, invariant 7).

Knows nothing about chat, HTTP, processes, or how a cell changes role inside: whoever switches a
cell calls `set_role` first and switches the cell after it returns.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Collection, Mapping
from types import TracebackType

import anyio
import msgspec
from anyio.abc import TaskGroup

from gyre._counters import Counters
from gyre.cell.wire import CellRole
from gyre.config import RouterConfig
from gyre.engines.protocol import (
    Completion,
    EngineStatistics,
    GenerateRequest,
    InferenceEngine,
    TokenDelta,
)
from gyre.engines.validate import remember_abort, validate_request
from gyre.errors import EngineTimeoutError, EngineUnavailableError, WeightSyncError
from gyre.routing.continuation import Continuation, RecomputeContinuation
from gyre.routing.membership import CellMember, CellRecord, Membership, check_role
from gyre.routing.redirect import Redirector, RequestState

__all__ = ["Router", "RouterStatistics"]

_ENCODER = msgspec.msgpack.Encoder()
_COMPLETIONS_DECODER = msgspec.msgpack.Decoder(list[Completion])


class RouterStatistics(EngineStatistics, frozen=True, kw_only=True):
    """`EngineStatistics` of the router as one engine, plus what routing did (docs/style.md rule 6).

    Engine fields: `weight_version` is the oldest version among rollout cells in service (0 with
    none); `running_requests`, `requests_total`, `requests_aborted` and `tokens_generated` count the
    router's callers' requests and the tokens they received; `max_model_len` and `vocab_size` are
    the smallest over all cells (a request must fit every cell it may move to).
    """

    requests_routed: int = 0
    """Attempts sent to cells (a request's first attempt per choice, plus every continuation)."""
    requests_redirected: int = 0
    """Continuations because the cell left rollout or went down (dead, refused)."""
    requests_retried: int = 0
    """Continuations after an attempt failed on a cell that stays in service (stall, error)."""
    requests_abandoned: int = 0
    """Requests whose caller went away before they ended (cancelled, or closed its stream early):
    their attempts were aborted on the cells at once."""
    aborts_failed: int = 0
    """Aborts of an attempt that a cell refused or did not answer in `abort_timeout_s`; each marked
    the cell down (logged once)."""
    requests_replayed: int = 0
    """Requests answered from the completions of an earlier request with the same ID."""
    tokens_recomputed: int = 0
    """Prompt + carried tokens the continuations' cells prefilled again (before prefix-cache
    hits)."""
    requests_migrated: int = 0
    """Continuations whose cell loaded the KV exported by the cell the choice left (its final
    delta reported the exported tokens cached)."""
    tokens_migrated: int = 0
    """Tokens of KV those continuations loaded instead of prefilling."""
    migrations_missed: int = 0
    """Continuations handed an export that their cell did not load (it prefilled instead: e.g.
    its KV folder is not the source's); their tokens count in `tokens_recomputed`."""
    redirect_latency_s_mean: float = 0.0
    """Mean time from a choice leaving its cell to its first token on the next one, seconds
    (for a held choice, from the end of its hold)."""
    redirect_latency_s_max: float = 0.0
    """Longest such time, seconds."""
    cells_rollout: int = 0
    cells_train: int = 0
    cells_switching: int = 0
    cells_down: int = 0
    """Cells out of service (any role)."""
    executions: int = 0
    """Executions pinned to a cell."""
    executions_held: int = 0
    """Executions held now (`Router.hold`): their requests wait for their next pin."""
    holds: int = 0
    """Times an execution was held (suspended), in all."""
    weight_loads_failed: int = 0
    """Weight loads that failed on a cell (each marked the cell down until a load succeeds)."""
    cells: tuple[CellRecord, ...] = ()
    """Every cell, in the order they were added."""


# -- the router ----------------------------------------------------------------------------------


class Router:
    """`InferenceEngine` over a set of named cells, each with a role (`rollout`, `train`,
    `switching`).

    Use as `async with Router(cells, config=...) as router:`; requests run in the router's task
    group (a consumer that stops iterating cancels its request, which is aborted on its cell). Only
    cells whose role is `rollout` and that are not down receive requests.

    Args:
        cells: name -> engine (a `CellClient`, a `VLLMEngine`, a `ScriptedEngine`); more with
            `add_cell`.
        roles: name -> initial role; cells not named start as `rollout`.
        config: timeouts and limits (`RouterConfig`).
        continuation: how a choice continues on another cell (default `RecomputeContinuation`).

    Raises `ValueError` for an unknown role or a duplicate cell name.
    """

    def __init__(
        self,
        cells: Mapping[str, InferenceEngine] | None = None,
        *,
        roles: Mapping[str, CellRole] | None = None,
        config: RouterConfig = RouterConfig(),
        continuation: Continuation | None = None,
    ) -> None:
        self.config = config
        self.continuation: Continuation = continuation or RecomputeContinuation()
        self._members = Membership(config)
        self._requests: dict[str, RequestState] = {}
        self._finished: dict[
            str, bytes
        ] = {}  # request ID -> its completions (msgpack: ~15 B/token)
        self._tombstones: dict[str, bool] = {}
        self._tg: TaskGroup | None = None
        self._paused = False
        self._weight_loads = 0
        self._counts = Counters(
            "requests_total", "requests_aborted", "requests_replayed", "requests_abandoned"
        )
        self._redirect: Redirector[CellMember] = Redirector(
            config, self.continuation, place=self._members.place, mark_down=self._members.mark_down
        )
        roles = dict(roles or {})
        unknown = set(roles) - set(cells or {})
        if unknown:
            raise ValueError(f"roles={roles!r} names cells {sorted(unknown)} that are not in cells")
        for name, engine in (cells or {}).items():
            self.add_cell(name, engine, role=roles.get(name, "rollout"))

    async def __aenter__(self) -> Router:
        if self._tg is not None:
            raise RuntimeError("Router is already open")
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        """Cancel every request still running (each is aborted on its cell) and close."""
        tg, self._tg = self._tg, None
        assert tg is not None
        tg.cancel_scope.cancel()
        return await tg.__aexit__(exc_type, exc, tb)

    # -- cells and roles ------------------------------------------------------------------------

    def add_cell(self, name: str, engine: InferenceEngine, *, role: CellRole = "rollout") -> None:
        """Add a cell; it serves at once if `role` is `rollout`. Its `statistics()` must answer now
        (a `CellClient` inside `async with`). Raises `ValueError` (duplicate name, unknown role)."""
        self._members.add(name, engine, role)

    def role(self, name: str) -> CellRole:
        """The role of cell `name` (`ValueError` if unknown)."""
        return self._members.member(name).role

    async def set_role(self, name: str, role: CellRole) -> int:
        """Give cell `name` a role; returns the in-flight attempts moved off it.

        Leaving `rollout` first drains the cell (see `drain`): when this returns, the cell runs none
        of the router's requests and gets no new ones, so it may be switched. Entering `rollout`
        puts it back into service for new and waiting requests.
        Raises `ValueError` (unknown cell or role), `EngineTimeoutError` (see `drain`).
        """
        cell = self._members.member(name)
        check_role(role)
        moved = 0
        if cell.role == "rollout" and role != "rollout":
            moved = await self.drain(name)
        cell.role = role
        self._members.changed.notify()
        return moved

    async def drain(self, name: str) -> int:
        """Move every in-flight attempt off cell `name`; returns how many were moved.

        The cell stops receiving requests (a `rollout` cell becomes `switching`); the executions
        pinned to it are unpinned. Each attempt is aborted on the cell (`engine.abort`, at most
        `abort_timeout_s`; a cell that fails to abort is marked down, `aborts_failed`), its stream
        read to its end (tokens so far kept, at most `abort_timeout_s` more, then abandoned) and its
        choice continued on another rollout cell, or waits for one.
        Raises `ValueError` (unknown cell), `EngineTimeoutError` if attempts are still registered
        on the cell after that (an internal fault).
        """
        cell = self._members.member(name)
        if cell.role == "rollout":
            cell.role = "switching"
        self._members.unpin_cell(cell)
        self._members.changed.notify()
        legs = list(cell.legs)
        async with anyio.create_task_group() as tg:
            for leg in legs:
                tg.start_soon(self._redirect.stop_leg, leg, "redirect")
        with anyio.move_on_after(self.config.abort_timeout_s):
            while cell.legs:
                await cell.legs_changed.wait()
        if cell.legs:
            raise EngineTimeoutError(
                f"cell {name!r}: {len(cell.legs)} attempts still registered "
                f"abort_timeout_s={self.config.abort_timeout_s} after they ended"
            )
        return len(legs)

    async def remove_cell(self, name: str) -> int:
        """Drain cell `name` (see `drain`) and forget it; returns the attempts moved off it. A
        restarted cell process comes back with `add_cell` under the same name and its new engine."""
        moved = await self.drain(name)
        self._members.remove(name)
        return moved

    def mark_down(self, name: str, reason: str) -> None:
        """Take cell `name` out of service (it died or must not serve); its attempts in flight end
        by themselves (their stream fails or stalls) and continue elsewhere; `drain` moves them
        now."""
        self._members.mark_down(self._members.member(name), reason)

    def retire(self, name: str, reason: str) -> None:
        """Take cell `name` out of service for good: its process died. Like `mark_down`, and no
        later `load_weights` is tried on it (a dead cell would fail every load and stop the run);
        `add_cell` after `remove_cell` brings a restarted process back. Raises `ValueError`
        (unknown cell)."""
        self._members.retire(name, reason)

    def mark_up(self, name: str) -> None:
        """Put cell `name` back into service (it gets requests again if its role is `rollout`)."""
        self._members.mark_up(name)

    def note_weight_version(self, name: str, version: int) -> None:
        """Record that cell `name`'s engine now holds weight `version`, loaded outside the router
        (a role switch loads it in the cell directly), so that `statistics()` reports it. Raises
        `ValueError` (unknown cell)."""
        self._members.member(name).weight_version = version

    def pin(self, execution_id: str, name: str) -> None:
        """Route the requests of `execution_id` to cell `name` from now on (a driver's placement;
        without one the router places an execution on its first request). Its attempts already
        running stay where they are; a held execution (`hold`) resumes there. Raises `ValueError`
        (unknown cell)."""
        self._members.pin(execution_id, name)

    def hold(self, execution_id: str) -> int:
        """Suspend `execution_id`: unpin it, stop its attempts in flight (aborted on their cells,
        the tokens sampled so far kept, as `drain` does) and hold its choices and new requests,
        unanswered, until `pin` names its next cell; there they continue from their tokens so far
        like a redirected choice (`requests_redirected`; each token keeps the version that sampled
        it). A held request still ends at its own deadline (`request_timeout_s`) or when its
        caller aborts it. Returns the attempts being stopped (the stops run in the router's task
        group)."""
        self._members.hold(execution_id)
        legs = [
            choice.leg
            for state in self._requests.values()
            if state.session == execution_id
            for choice in state.choices
            if choice.leg is not None
        ]
        for leg in legs:
            assert self._tg is not None, "a request in flight outside `async with router:`"
            self._tg.start_soon(self._redirect.stop_leg, leg, "redirect")
        return len(legs)

    def engine_for(self, execution_id: str) -> InferenceEngine:
        """The router as seen by one execution (pass this method as the proxy's `engine_for`):
        its requests are routed with `execution_id` as the affinity key."""
        return _ExecutionEngine(self, execution_id)

    def end_execution(self, execution_id: str) -> None:
        """Forget the cell an execution is pinned to, or its hold (call when it finishes; unknown
        IDs are ignored)."""
        self._members.end_execution(execution_id)

    # -- the InferenceEngine protocol -----------------------------------------------------------

    async def generate(
        self, request: GenerateRequest, *, execution_id: str | None = None
    ) -> AsyncGenerator[TokenDelta, None]:
        """Stream the choices of `request` from the rollout cells as one uninterrupted stream.

        `execution_id` is the affinity key; without it, the request ID up to its last `/` (the
        proxy's `{execution}/{call}`), or the whole ID. Every token carries the version that sampled
        it; a choice's finish reason is that of its last attempt. A request ID seen before replays
        its recorded completions (idempotent retries); one aborted before it arrived ends at once
        with 0 tokens. Iterate inside `contextlib.aclosing` (the proxy does): a caller cancelled
        or closing the stream before the end, before its first token included, has the request
        aborted on its cells before the cancellation or `aclose` completes (`requests_abandoned`).

        Raises: `InvalidRequestError` (bad request; checked against the smallest cell limits),
        `EngineUnavailableError` (router closed or paused, request ID already running, no rollout
        cell for `no_cell_timeout_s`, a choice failed `max_retries` + 1 times),
        `EngineTimeoutError` (`request_timeout_s` ran out).
        """
        state = self._accept(request, execution_id)
        if isinstance(state, list):
            for delta in state:
                yield delta
            return
        pending = {c.index for c in state.choices}
        assert self._tg is not None
        self._tg.start_soon(self._serve, state, name=f"router {request.request_id}")
        left = True  # the caller went away (cancelled, or closed the stream) unless set below
        try:
            async with state.receive:
                async for item in state.receive:
                    if isinstance(item, Exception):
                        left = False
                        raise item
                    if item.finish_reason is not None:
                        pending.discard(item.index)
                    yield item
            left = False
            if pending:
                raise EngineUnavailableError(
                    f"request {request.request_id!r}: router closed before choices "
                    f"{sorted(pending)} finished"
                )
        finally:
            with anyio.CancelScope(shield=True):
                if pending and not state.served.is_set():  # the caller stopped early, or failed
                    self._counts["requests_abandoned"] += left
                    await self._abort_request(state)  # on the cells first, then stop listening
                state.scope.cancel()
                with anyio.move_on_after(2 * self.config.abort_timeout_s + 1):
                    await state.served.wait()  # no attempt of this request runs anywhere after this

    async def abort(self, request_id: str) -> list[Completion]:
        """Stop a request on whichever cells run it; return each choice's tokens so far across all
        its attempts (finish `abort` unless the choice had finished). Waits at most
        `abort_timeout_s` per cell. Unknown or finished IDs return []; an unknown ID is remembered,
        so a request that arrives later ends at once with 0 tokens."""
        state = self._requests.get(request_id)
        if state is None:
            if request_id not in self._finished:
                remember_abort(self._tombstones, request_id)
            return []
        return await self._abort_request(state)

    async def _abort_request(self, state: RequestState) -> list[Completion]:
        for choice in state.choices:
            choice.user_aborted = True
        self._members.changed.notify()  # wakes choices waiting for a cell
        async with anyio.create_task_group() as tg:
            for choice in state.choices:
                if choice.leg is not None:
                    tg.start_soon(self._redirect.stop_leg, choice.leg, "user")
        with anyio.move_on_after(self.config.abort_timeout_s):
            for choice in state.choices:
                await choice.done.wait()
        if not all(c.done.is_set() for c in state.choices):
            state.scope.cancel()
        return [c.completion() for c in state.choices]

    async def load_weights(self, snapshot: str, version: int) -> None:
        """Load `snapshot` as `version` on every `rollout` cell at once, retired ones excepted
        (each bounded by its own engine's weight-load timeout). A cell that fails is marked down and
        gets no requests until a later load succeeds on it (field case B17); a down cell whose load
        succeeds serves again. Raises `WeightSyncError` naming every cell that failed and why."""
        failed = await self.try_load_weights(snapshot, version)
        if failed:
            raise WeightSyncError(f"weight load of version {version} failed on cells {failed}")

    async def try_load_weights(
        self, snapshot: str, version: int, cells: Collection[str] | None = None
    ) -> dict[str, str]:
        """`load_weights` on the `rollout` cells named in `cells` (None: all of them); returns
        cell name -> why, for each cell that failed (marked down), instead of raising. A load of
        all of them counts in `weight_loads` unless every cell tried failed."""
        tried, failed = await self._members.load_weights(snapshot, version, cells)
        if cells is None and (not failed or len(failed) < tried):
            self._weight_loads += 1
        return failed

    async def pause(self) -> None:
        """Refuse new requests (`EngineUnavailableError`); requests in flight run on. Cells are
        paused by whoever switches them, after `set_role`."""
        self._paused = True

    async def resume(self) -> None:
        """Accept new requests again."""
        self._paused = False

    def statistics(self) -> RouterStatistics:
        """A snapshot of the router's counters and of every cell (see `RouterStatistics`)."""
        return RouterStatistics(
            running_requests=len(self._requests),
            paused=self._paused,
            weight_loads=self._weight_loads,
            prefix_cache_resets=self._weight_loads,
            requests_total=self._counts["requests_total"],
            requests_aborted=self._counts["requests_aborted"],
            requests_replayed=self._counts["requests_replayed"],
            requests_abandoned=self._counts["requests_abandoned"],
            **msgspec.structs.asdict(self._redirect.statistics()),
            **msgspec.structs.asdict(self._members.statistics()),
        )

    # -- requests -------------------------------------------------------------------------------

    def _accept(
        self, request: GenerateRequest, execution_id: str | None
    ) -> RequestState | list[TokenDelta]:
        """Admit a request (no checkpoint): its state, or the deltas to answer it with at once."""
        rid = request.request_id
        if self._tg is None:
            raise EngineUnavailableError(
                f"request {rid!r} refused: the router is not open (`async with router:`)"
            )
        if rid in self._requests:
            raise EngineUnavailableError(f"request {rid!r} is already running")
        done = self._finished.get(rid)
        if done is not None:
            self._counts["requests_replayed"] += 1
            return [
                TokenDelta(
                    index=c.index,
                    token_ids=c.token_ids,
                    logprobs=c.logprobs,
                    versions=c.versions,
                    finish_reason=c.finish_reason,
                )
                for c in _COMPLETIONS_DECODER.decode(done)
            ]
        if self._paused:
            raise EngineUnavailableError(f"request {rid!r} refused: the router is paused")
        cells = self._members.cells.values()
        if not cells:
            raise EngineUnavailableError(f"request {rid!r} refused: the router has no cells")
        max_tokens = validate_request(
            request,
            vocab_size=min(c.vocab_size for c in cells),
            max_model_len=min(c.max_model_len for c in cells),
        )
        if self._tombstones.pop(rid, False):  # aborted before it arrived: 0 tokens (field case B20)
            self._counts["requests_aborted"] += 1
            return [
                TokenDelta(index=i, token_ids=[], logprobs=[], versions=[], finish_reason="abort")
                for i in range(request.sampling.n)
            ]
        if execution_id is None:
            execution_id = rid.rpartition("/")[0] or rid
        state = RequestState(request, execution_id, max_tokens)
        self._requests[rid] = state
        self._counts["requests_total"] += 1
        return state

    async def _serve(self, state: RequestState) -> None:
        rid = state.request.request_id
        try:
            with state.scope:
                async with anyio.create_task_group() as tg:
                    for choice in state.choices:
                        tg.start_soon(self._redirect.run_choice, state, choice)
        finally:
            try:
                state.send.close()
                if self._requests.get(rid) is state:
                    del self._requests[rid]
                if any(c.finish == "abort" for c in state.choices):
                    self._counts["requests_aborted"] += 1
                if self.config.remember_finished and all(
                    c.finish is not None for c in state.choices
                ):
                    self._finished[rid] = _ENCODER.encode([c.completion() for c in state.choices])
                    while len(self._finished) > self.config.remember_finished:
                        del self._finished[next(iter(self._finished))]
            finally:
                state.served.set()


class _ExecutionEngine:
    """The router as one execution sees it (`Router.engine_for`): an `InferenceEngine` whose
    requests carry the execution as their affinity key. Everything else is the router's."""

    def __init__(self, router: Router, execution_id: str) -> None:
        self.router = router
        self.execution_id = execution_id

    def generate(self, request: GenerateRequest) -> AsyncGenerator[TokenDelta, None]:
        return self.router.generate(request, execution_id=self.execution_id)

    async def abort(self, request_id: str) -> list[Completion]:
        return await self.router.abort(request_id)

    async def load_weights(self, snapshot: str, version: int) -> None:
        await self.router.load_weights(snapshot, version)

    async def pause(self) -> None:
        await self.router.pause()

    async def resume(self) -> None:
        await self.router.resume()

    def statistics(self) -> RouterStatistics:
        return self.router.statistics()
