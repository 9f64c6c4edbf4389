"""The router: session-affine routing of generate requests over the rollout cells, and moving
in-flight requests off a cell that leaves rollout, dies or stalls.

Owns `Router` (itself an `InferenceEngine`; `Router.engine_for(execution_id)` gives the per-execution
view the TITO proxy asks for), `RouterStatistics` / `CellRecord`, and the `Continuation` seam with
`RecomputeContinuation` and `MigrateContinuation` (KV migration: the cell left exports the KV of
prompt + tokens so far, the next cell loads it instead of prefilling; recompute when that fails).

An execution's requests stay on one rollout cell while that cell rolls out (prefix-cache reuse); a
new execution goes to the least-loaded cell. When a cell leaves rollout (`set_role`, `drain`), dies
(`EngineUnavailableError`) or stalls (`attempt_timeout_s`), each of its in-flight choices is aborted
there with its tokens so far and continued on another rollout cell from prompt + tokens so far with
max_tokens reduced and a seed derived per attempt (`choice_seed`), so a continuation is not a replay
and greedy continuations equal an uninterrupted run. The caller sees one uninterrupted stream whose
tokens carry the versions that sampled them (FIELD_CASES B11). Every wait is bounded (`RouterConfig`,
DESIGN.md invariant 7).

Knows nothing about chat, HTTP, processes, or how a cell changes role inside: whoever switches a
cell calls `set_role` first and switches the cell after it returns.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import Literal, Protocol, get_args, runtime_checkable

import anyio
import msgspec
from anyio.abc import TaskGroup

from gyre.config import RouterConfig
from gyre.engines.protocol import (
    Completion,
    EngineStatistics,
    FinishReason,
    GenerateRequest,
    InferenceEngine,
    KVExport,
    KVTransferEngine,
    TokenDelta,
    choice_seed,
)
from gyre.engines.validate import remember_abort, validate_request
from gyre.errors import (
    EngineError,
    EngineTimeoutError,
    EngineUnavailableError,
    GyreError,
    InvalidRequestError,
    WeightSyncError,
)
from gyre.runtime.scheduler import Role

__all__ = [
    "Router",
    "RouterStatistics",
    "CellRecord",
    "Continuation",
    "ContinuationPlan",
    "RecomputeContinuation",
    "MigrateContinuation",
    "MigrationRecord",
    "MigrationStatistics",
]

_ROLES: tuple[str, ...] = get_args(Role)
_ENCODER = msgspec.msgpack.Encoder()
_COMPLETIONS_DECODER = msgspec.msgpack.Decoder(list[Completion])
_StopReason = Literal["redirect", "timeout", "user"]


# -- the continuation seam (KV migration plugs in here) ------------------------------------------


class ContinuationPlan(msgspec.Struct, frozen=True, kw_only=True):
    """How a target cell continues a choice: the request it runs and the prefill work it redoes."""

    request: GenerateRequest
    """What the target runs: prompt + tokens so far, max_tokens reduced, the attempt's seed."""
    tokens_recomputed: int
    """Tokens the target prefills again because no KV came along (before its own prefix-cache hits)."""
    tokens_loaded: int = 0
    """Tokens whose KV the target loads from `export` instead of prefilling them."""
    export: KVExport | None = None
    """The KV export the target loads; released by the strategy once the attempt has ended."""


@runtime_checkable
class Continuation(Protocol):
    """Strategy that readies a target cell to continue a choice another cell started.

    1. `leave` runs as soon as an attempt ended unfinished on `source` (aborted, died or stalled),
       while the attempt still counts as running there, so a drain waits for it and the cell has
       not switched yet: a KV-migrating strategy exports the KV of prompt + tokens so far now. It
       returns what `prepare` gets as `carried`; it never raises (a failure is carried instead)
       and bounds its own waits, below `RouterConfig.abort_timeout_s`.
    2. `prepare` gets the continuation request (prompt = original prompt + tokens so far) and the
       target cell; it returns a request that makes `target` load the carried KV, or recomputes.
       Errors: `EngineError` from either engine fails the attempt (retried like any other failure).
    3. `release` runs (shielded) once the attempt that ran the plan ended: free what was exported.
    """

    async def leave(self, request: GenerateRequest, *, source: InferenceEngine) -> object: ...

    async def prepare(
        self,
        request: GenerateRequest,
        *,
        source: InferenceEngine | None,
        target: InferenceEngine,
        carried: object = None,
    ) -> ContinuationPlan: ...

    async def release(self, plan: ContinuationPlan, *, target: InferenceEngine) -> None: ...


class RecomputeContinuation:
    """Continue by recomputing: the target prefills prompt + tokens so far."""

    async def leave(self, request: GenerateRequest, *, source: InferenceEngine) -> object:
        return None

    async def prepare(
        self,
        request: GenerateRequest,
        *,
        source: InferenceEngine | None,
        target: InferenceEngine,
        carried: object = None,
    ) -> ContinuationPlan:
        return ContinuationPlan(request=request, tokens_recomputed=len(request.prompt_ids))

    async def release(self, plan: ContinuationPlan, *, target: InferenceEngine) -> None:
        return None


class MigrationRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What happened to one continuation under `MigrateContinuation`."""

    request_id: str
    """The continuation attempt's request ID (`{request}@{choice}.{attempt}`)."""
    outcome: Literal["migrated", "recomputed"]
    sequence_tokens: int
    """Prompt + tokens so far: the context the target continues from."""
    tokens_moved: int
    """Tokens whose KV the target loads (0 when recomputed)."""
    export_s: float
    """Seconds spent exporting on the source (0 when no export was tried)."""
    reason: str | None = None
    """Why it was recomputed (export failed or timed out, weights differ, ...); None when migrated."""


class MigrationStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Counters of a `MigrateContinuation` (STYLE.md rule 6)."""

    migrated: int
    """Continuations whose target loads the exported KV."""
    recomputed: int
    """Continuations that fell back to recompute."""
    tokens_moved: int
    """Tokens of KV handed to targets."""
    export_s_total: float
    """Seconds spent in exports (successful or not)."""
    export_s_max: float
    exports_failed: int
    """Exports that failed or timed out (their continuations recomputed)."""
    released: int
    """Exports deleted after their continuation ended."""
    release_failed: int
    """Exports whose deletion failed (left to the store's lease)."""
    records: tuple[MigrationRecord, ...]
    """The most recent continuations, oldest first (at most `keep_records`)."""


class MigrateContinuation:
    """Continue by moving the KV cache: `source.export_kv` at `leave`, the target loads it.

    Falls back to recompute, automatically and still exact under greedy, when the source cannot
    export (no `KVTransferEngine`, no connector, dead, paused), the export fails or exceeds
    `export_timeout_s`, the target is no `KVTransferEngine`, or the weights differ. An export whose
    continuation never ran is deleted by the store's lease (`KVTransferConfig.lease_s`).

    Args:
        export_timeout_s: longest export on the source; keep it below `RouterConfig.abort_timeout_s`
            (a drain waits for it).
        release_timeout_s: longest wait for deleting an export.
        keep_records: how many `MigrationRecord`s `statistics()` keeps.
    Raises `ValueError` for a non-positive timeout or a negative `keep_records`.
    """

    def __init__(self, *, export_timeout_s: float = 20.0, release_timeout_s: float = 5.0, keep_records: int = 256) -> None:
        if export_timeout_s <= 0 or release_timeout_s <= 0:
            raise ValueError(f"{export_timeout_s=} and {release_timeout_s=} must be > 0")
        if keep_records < 0:
            raise ValueError(f"{keep_records=} must be >= 0")
        self.export_timeout_s = export_timeout_s
        self.release_timeout_s = release_timeout_s
        self._records: deque[MigrationRecord] = deque(maxlen=keep_records)
        self._counts = dict(migrated=0, recomputed=0, tokens_moved=0, exports_failed=0, released=0, release_failed=0)
        self._export_s_total = 0.0
        self._export_s_max = 0.0

    async def leave(self, request: GenerateRequest, *, source: InferenceEngine) -> object:
        """Export the KV of `request.prompt_ids` on `source`: a `KVExport`, or why not (str)."""
        if not isinstance(source, KVTransferEngine):
            return f"source engine {type(source).__name__} cannot export KV"
        t0 = anyio.current_time()
        try:
            with anyio.fail_after(self.export_timeout_s):
                carried: object = await source.export_kv(request.prompt_ids)
        except TimeoutError:
            carried = f"export timed out after export_timeout_s={self.export_timeout_s}"
        except GyreError as exc:  # recovered from: the continuation recomputes (counted)
            carried = f"export failed: {type(exc).__name__}: {exc}"
        seconds = anyio.current_time() - t0
        self._export_s_total += seconds
        self._export_s_max = max(self._export_s_max, seconds)
        if isinstance(carried, str):
            self._counts["exports_failed"] += 1
        return carried

    async def prepare(
        self,
        request: GenerateRequest,
        *,
        source: InferenceEngine | None,
        target: InferenceEngine,
        carried: object = None,
    ) -> ContinuationPlan:
        n = len(request.prompt_ids)
        export_s = 0.0
        reason = carried if isinstance(carried, str) else "nothing was exported"
        if isinstance(carried, KVExport):
            export_s = carried.seconds
            if not isinstance(target, KVTransferEngine):
                reason = f"target engine {type(target).__name__} cannot load KV"
            elif carried.sequence_tokens != n:
                reason = f"export holds {carried.sequence_tokens} tokens, the continuation {n}"
            elif carried.weight_version != target.statistics().weight_version:
                reason = (
                    f"export computed with weight version {carried.weight_version}, "
                    f"target at {target.statistics().weight_version}"
                )
            else:
                self._record(MigrationRecord(
                    request_id=request.request_id, outcome="migrated", sequence_tokens=n,
                    tokens_moved=carried.tokens, export_s=export_s,
                ))
                return ContinuationPlan(
                    request=msgspec.structs.replace(request, kv_import=carried),
                    tokens_recomputed=n - carried.tokens, tokens_loaded=carried.tokens, export=carried,
                )
            await self._delete(carried, target)
        self._record(MigrationRecord(
            request_id=request.request_id, outcome="recomputed", sequence_tokens=n, tokens_moved=0,
            export_s=export_s, reason=reason,
        ))
        return ContinuationPlan(request=request, tokens_recomputed=n)

    async def release(self, plan: ContinuationPlan, *, target: InferenceEngine) -> None:
        """Delete the plan's export (bounded by `release_timeout_s`); failures are counted, and
        the store's lease deletes the export later."""
        if plan.export is not None:
            await self._delete(plan.export, target)

    async def _delete(self, export: KVExport, target: InferenceEngine) -> None:
        if not isinstance(target, KVTransferEngine):
            self._counts["release_failed"] += 1
            return
        try:
            with anyio.fail_after(self.release_timeout_s):
                await target.release_kv(export.key)
            self._counts["released"] += 1
        except (TimeoutError, GyreError):  # recovered from: the lease deletes it (counted)
            self._counts["release_failed"] += 1

    def _record(self, record: MigrationRecord) -> None:
        self._counts[record.outcome] += 1
        self._counts["tokens_moved"] += record.tokens_moved
        self._records.append(record)

    def statistics(self) -> MigrationStatistics:
        """A snapshot of the counters and the most recent records."""
        return MigrationStatistics(
            export_s_total=self._export_s_total, export_s_max=self._export_s_max, records=tuple(self._records),
            **self._counts,
        )


# -- statistics ----------------------------------------------------------------------------------


class CellRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One cell as the router sees it."""

    name: str
    role: Role
    down: str | None
    """Why the cell gets no requests (it died, refused, or a weight load failed); None: in service."""
    running: int
    """Attempts in flight on the cell."""
    executions: int
    """Executions pinned to the cell (session affinity); 0 unless it rolls out."""
    weight_version: int
    """Version last loaded through the router (or reported when the cell was added)."""


class RouterStatistics(EngineStatistics, frozen=True, kw_only=True):
    """`EngineStatistics` of the router as one engine, plus what routing did (STYLE.md rule 6).

    Engine fields: `weight_version` is the oldest version among rollout cells in service (0 with
    none); `running_requests`, `requests_total`, `requests_aborted` and `tokens_generated` count the
    router's callers' requests and the tokens they received; `max_model_len` and `vocab_size` are the
    smallest over all cells (a request must fit every cell it may move to).
    """

    requests_routed: int = 0
    """Attempts sent to cells (a request's first attempt per choice, plus every continuation)."""
    requests_redirected: int = 0
    """Continuations because the cell left rollout or went down (dead, refused)."""
    requests_retried: int = 0
    """Continuations after an attempt failed on a cell that stays in service (stall, error)."""
    requests_replayed: int = 0
    """Requests answered from the completions of an earlier request with the same ID."""
    tokens_recomputed: int = 0
    """Prompt + carried tokens the continuations' cells prefilled again (before prefix-cache hits)."""
    requests_migrated: int = 0
    """Continuations whose cell loaded the KV exported by the cell the choice left."""
    tokens_migrated: int = 0
    """Tokens of KV those continuations loaded instead of prefilling."""
    redirect_latency_s_mean: float = 0.0
    """Mean time from a choice leaving its cell to its first token on the next one, seconds."""
    redirect_latency_s_max: float = 0.0
    """Longest such time, seconds."""
    cells_rollout: int = 0
    cells_train: int = 0
    cells_switching: int = 0
    cells_down: int = 0
    """Cells out of service (any role)."""
    executions: int = 0
    """Executions pinned to a cell."""
    cells: tuple[CellRecord, ...] = ()
    """Every cell, in the order they were added."""


# -- internal state ------------------------------------------------------------------------------


class _Signal:
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


class _Cell:
    def __init__(self, name: str, engine: InferenceEngine, role: Role, order: int, stats: EngineStatistics) -> None:
        self.name = name
        self.engine = engine
        self.role: Role = role
        self.order = order
        self.down: str | None = None
        self.legs: set[_Leg] = set()
        self.executions = 0
        self.weight_version = stats.weight_version
        self.max_model_len = stats.max_model_len
        self.vocab_size = stats.vocab_size
        self.legs_changed = _Signal()

    @property
    def serving(self) -> bool:
        return self.role == "rollout" and self.down is None


class _Leg:
    """One attempt of one choice on one cell (an n=1 request with its own ID)."""

    def __init__(self, cell: _Cell, request_id: str) -> None:
        self.cell = cell
        self.request_id = request_id
        self.scope = anyio.CancelScope()
        self.ended = anyio.Event()
        self.stop_reason: _StopReason | None = None
        self.stopped_s: float | None = None
        self.abort_sent = False
        self.abort_result: list[Completion] | None = None
        self.finish: FinishReason | None = None
        self.cached: int | None = None
        self.error: EngineError | None = None
        self.streamed = 0
        self.last_token_s = anyio.current_time()


class _Choice:
    def __init__(self, index: int, max_tokens: int) -> None:
        self.index = index
        self.max_tokens = max_tokens
        self.ids: list[int] = []
        self.lps: list[float] = []
        self.vers: list[int] = []
        self.finish: FinishReason | None = None
        self.cached: int | None = None
        self.leg: _Leg | None = None
        self.user_aborted = False
        self.moved_s: float | None = None
        self.done = anyio.Event()

    def completion(self) -> Completion:
        return Completion(
            index=self.index, token_ids=list(self.ids), logprobs=list(self.lps), versions=list(self.vers),
            finish_reason=self.finish or "abort",
        )


class _Request:
    def __init__(self, request: GenerateRequest, session: str, max_tokens: int) -> None:
        self.request = request
        self.session = session
        self.choices = [_Choice(i, max_tokens) for i in range(request.sampling.n)]
        self.scope = anyio.CancelScope()
        self.served = anyio.Event()
        self.send, self.receive = anyio.create_memory_object_stream[TokenDelta | Exception](math.inf)


# -- the router ----------------------------------------------------------------------------------


class Router:
    """`InferenceEngine` over a set of named cells, each with a role (`rollout`, `train`, `switching`).

    Use as `async with Router(cells, config=...) as router:`; requests run in the router's task
    group (a consumer that stops iterating cancels its request, which is aborted on its cell). Only
    cells whose role is `rollout` and that are not down receive requests.

    Args:
        cells: name -> engine (a `CellClient`, a `VLLMEngine`, a `ScriptedEngine`); more with `add_cell`.
        roles: name -> initial role; cells not named start as `rollout`.
        config: timeouts and limits (`RouterConfig`).
        continuation: how a choice continues on another cell (default `RecomputeContinuation`).

    Raises `ValueError` for an unknown role or a duplicate cell name.
    """

    def __init__(
        self,
        cells: Mapping[str, InferenceEngine] | None = None,
        *,
        roles: Mapping[str, Role] | None = None,
        config: RouterConfig = RouterConfig(),
        continuation: Continuation | None = None,
    ) -> None:
        self.config = config
        self.continuation: Continuation = continuation or RecomputeContinuation()
        self._cells: dict[str, _Cell] = {}
        self._pins: dict[str, _Cell] = {}
        self._requests: dict[str, _Request] = {}
        self._finished: dict[str, bytes] = {}  # request ID -> its completions (msgpack: ~15 B/token)
        self._tombstones: dict[str, bool] = {}
        self._cells_changed = _Signal()
        self._tg: TaskGroup | None = None
        self._paused = False
        self._weight_loads = 0
        self._counts = dict(
            requests_total=0, requests_aborted=0, tokens_generated=0, requests_routed=0,
            requests_redirected=0, requests_retried=0, requests_replayed=0, tokens_recomputed=0,
            requests_migrated=0, tokens_migrated=0,
        )
        self._latency_total_s = 0.0
        self._latency_max_s = 0.0
        self._latency_count = 0
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

    async def __aexit__(self, *exc_info: object) -> bool | None:
        """Cancel every request still running (each is aborted on its cell) and close."""
        tg, self._tg = self._tg, None
        assert tg is not None
        tg.cancel_scope.cancel()
        return await tg.__aexit__(*exc_info)

    # -- cells and roles ------------------------------------------------------------------------

    def add_cell(self, name: str, engine: InferenceEngine, *, role: Role = "rollout") -> None:
        """Add a cell; it serves at once if `role` is `rollout`. Its `statistics()` must answer now
        (a `CellClient` inside `async with`). Raises `ValueError` (duplicate name, unknown role)."""
        if name in self._cells:
            raise ValueError(f"cell {name!r} is already in the router")
        _check_role(role)
        self._cells[name] = _Cell(name, engine, role, len(self._cells), engine.statistics())
        self._cells_changed.notify()

    def role(self, name: str) -> Role:
        """The role of cell `name` (`ValueError` if unknown)."""
        return self._cell(name).role

    async def set_role(self, name: str, role: Role) -> int:
        """Give cell `name` a role; returns the in-flight attempts moved off it.

        Leaving `rollout` first drains the cell (see `drain`): when this returns, the cell runs none
        of the router's requests and gets no new ones, so it may be switched. Entering `rollout`
        puts it back into service for new and waiting requests.
        Raises `ValueError` (unknown cell or role), `EngineTimeoutError` (see `drain`).
        """
        cell = self._cell(name)
        _check_role(role)
        moved = 0
        if cell.role == "rollout" and role != "rollout":
            moved = await self.drain(name)
        cell.role = role
        self._cells_changed.notify()
        return moved

    async def drain(self, name: str) -> int:
        """Move every in-flight attempt off cell `name`; returns how many were moved.

        The cell stops receiving requests (a `rollout` cell becomes `switching`); the executions
        pinned to it are unpinned. Each attempt is aborted on the cell (`engine.abort`, at most
        `abort_timeout_s`), its stream read to its end (tokens so far kept, at most `abort_timeout_s`
        more, then abandoned) and its choice continued on another rollout cell, or waits for one.
        Raises `ValueError` (unknown cell), `EngineTimeoutError` if attempts are still registered
        on the cell after that (an internal fault).
        """
        cell = self._cell(name)
        if cell.role == "rollout":
            cell.role = "switching"
        self._unpin_cell(cell)
        self._cells_changed.notify()
        legs = list(cell.legs)
        async with anyio.create_task_group() as tg:
            for leg in legs:
                tg.start_soon(self._stop_leg, leg, "redirect")
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
        del self._cells[name]
        self._cells_changed.notify()
        return moved

    def mark_down(self, name: str, reason: str) -> None:
        """Take cell `name` out of service (it died or must not serve); its attempts in flight end
        by themselves (their stream fails or stalls) and continue elsewhere; `drain` moves them now."""
        self._mark_down(self._cell(name), reason)

    def mark_up(self, name: str) -> None:
        """Put cell `name` back into service (it gets requests again if its role is `rollout`)."""
        self._cell(name).down = None
        self._cells_changed.notify()

    def pin(self, execution_id: str, name: str) -> None:
        """Route the requests of `execution_id` to cell `name` from now on (a driver's placement;
        without one the router places an execution on its first request). Its attempts already
        running stay where they are. Raises `ValueError` (unknown cell)."""
        cell = self._cell(name)
        old = self._pins.get(execution_id)
        if old is not None:
            old.executions -= 1
        self._pins[execution_id] = cell
        cell.executions += 1

    def engine_for(self, execution_id: str) -> InferenceEngine:
        """The router as seen by one execution (pass this method as the proxy's `engine_for`):
        its requests are routed with `execution_id` as the affinity key."""
        return _ExecutionEngine(self, execution_id)

    def end_execution(self, execution_id: str) -> None:
        """Forget the cell an execution is pinned to (call when it finishes; unknown IDs are ignored)."""
        cell = self._pins.pop(execution_id, None)
        if cell is not None:
            cell.executions -= 1

    # -- the InferenceEngine protocol -----------------------------------------------------------

    async def generate(self, request: GenerateRequest, *, execution_id: str | None = None) -> AsyncIterator[TokenDelta]:
        """Stream the choices of `request` from the rollout cells as one uninterrupted stream.

        `execution_id` is the affinity key; without it, the request ID up to its last `/` (the
        proxy's `{execution}/{call}`), or the whole ID. Every token carries the version that sampled
        it; a choice's finish reason is that of its last attempt. A request ID seen before replays
        its recorded completions (idempotent retries); one aborted before it arrived ends at once
        with 0 tokens. Iterate inside `contextlib.aclosing` (the proxy does).

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
        try:
            async with state.receive:
                async for item in state.receive:
                    if isinstance(item, Exception):
                        raise item
                    if item.finish_reason is not None:
                        pending.discard(item.index)
                    yield item
            if pending:
                raise EngineUnavailableError(
                    f"request {request.request_id!r}: router closed before choices {sorted(pending)} finished"
                )
        finally:
            with anyio.CancelScope(shield=True):
                if pending and not state.served.is_set():  # the caller stopped early, or failed
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

    async def _abort_request(self, state: _Request) -> list[Completion]:
        for choice in state.choices:
            choice.user_aborted = True
        self._cells_changed.notify()  # wakes choices waiting for a cell
        async with anyio.create_task_group() as tg:
            for choice in state.choices:
                if choice.leg is not None:
                    tg.start_soon(self._stop_leg, choice.leg, "user")
        with anyio.move_on_after(self.config.abort_timeout_s):
            for choice in state.choices:
                await choice.done.wait()
        if not all(c.done.is_set() for c in state.choices):
            state.scope.cancel()
        return [c.completion() for c in state.choices]

    async def load_weights(self, snapshot: str, version: int) -> None:
        """Load `snapshot` as `version` on every `rollout` cell at once (each bounded by its own
        engine's weight-load timeout). A cell that fails is marked down and gets no requests until
        a later load succeeds on it (FIELD_CASES B17); a down cell whose load succeeds serves again.
        Raises `WeightSyncError` naming every cell that failed and why."""
        failed: dict[str, str] = {}

        async def load(cell: _Cell) -> None:
            try:
                await cell.engine.load_weights(snapshot, version)
            except (EngineError, WeightSyncError) as exc:
                failed[cell.name] = str(exc)
                self._mark_down(cell, f"weight load of version {version} failed: {exc}")
                return
            cell.weight_version = version
            cell.down = None

        async with anyio.create_task_group() as tg:
            for cell in self._cells.values():
                if cell.role == "rollout":
                    tg.start_soon(load, cell)
        self._cells_changed.notify()
        if failed:
            raise WeightSyncError(f"weight load of version {version} failed on cells {failed}")
        self._weight_loads += 1

    async def pause(self) -> None:
        """Refuse new requests (`EngineUnavailableError`); requests in flight run on. Cells are
        paused by whoever switches them, after `set_role`."""
        self._paused = True

    async def resume(self) -> None:
        """Accept new requests again."""
        self._paused = False

    def statistics(self) -> RouterStatistics:
        """A snapshot of the router's counters and of every cell (see `RouterStatistics`)."""
        cells = tuple(
            CellRecord(
                name=c.name, role=c.role, down=c.down, running=len(c.legs), executions=c.executions,
                weight_version=c.weight_version,
            )
            for c in self._cells.values()
        )
        serving = [c for c in self._cells.values() if c.serving]
        n = self._latency_count
        return RouterStatistics(
            weight_version=min((c.weight_version for c in serving), default=0),
            running_requests=len(self._requests),
            paused=self._paused,
            weight_loads=self._weight_loads,
            prefix_cache_resets=self._weight_loads,
            max_model_len=min((c.max_model_len for c in self._cells.values()), default=0),
            vocab_size=min((c.vocab_size for c in self._cells.values()), default=0),
            redirect_latency_s_mean=self._latency_total_s / n if n else 0.0,
            redirect_latency_s_max=self._latency_max_s,
            cells_rollout=sum(c.role == "rollout" for c in cells),
            cells_train=sum(c.role == "train" for c in cells),
            cells_switching=sum(c.role == "switching" for c in cells),
            cells_down=sum(c.down is not None for c in cells),
            executions=len(self._pins),
            cells=cells,
            **self._counts,
        )

    # -- requests -------------------------------------------------------------------------------

    def _accept(self, request: GenerateRequest, execution_id: str | None) -> _Request | list[TokenDelta]:
        """Admit a request (no checkpoint): its state, or the deltas to answer it with at once."""
        rid = request.request_id
        if self._tg is None:
            raise EngineUnavailableError(f"request {rid!r} refused: the router is not open (`async with router:`)")
        if rid in self._requests:
            raise EngineUnavailableError(f"request {rid!r} is already running")
        done = self._finished.get(rid)
        if done is not None:
            self._counts["requests_replayed"] += 1
            return [
                TokenDelta(
                    index=c.index, token_ids=c.token_ids, logprobs=c.logprobs, versions=c.versions,
                    finish_reason=c.finish_reason,
                )
                for c in _COMPLETIONS_DECODER.decode(done)
            ]
        if self._paused:
            raise EngineUnavailableError(f"request {rid!r} refused: the router is paused")
        if not self._cells:
            raise EngineUnavailableError(f"request {rid!r} refused: the router has no cells")
        max_tokens = validate_request(
            request,
            vocab_size=min(c.vocab_size for c in self._cells.values()),
            max_model_len=min(c.max_model_len for c in self._cells.values()),
        )
        if self._tombstones.pop(rid, False):  # aborted before it arrived: 0 tokens (FIELD_CASES B20)
            self._counts["requests_aborted"] += 1
            return [
                TokenDelta(index=i, token_ids=[], logprobs=[], versions=[], finish_reason="abort")
                for i in range(request.sampling.n)
            ]
        if execution_id is None:
            execution_id = rid.rpartition("/")[0] or rid
        state = _Request(request, execution_id, max_tokens)
        self._requests[rid] = state
        self._counts["requests_total"] += 1
        return state

    async def _serve(self, state: _Request) -> None:
        rid = state.request.request_id
        try:
            with state.scope:
                async with anyio.create_task_group() as tg:
                    for choice in state.choices:
                        tg.start_soon(self._run_choice, state, choice)
        finally:
            try:
                state.send.close()
                if self._requests.get(rid) is state:
                    del self._requests[rid]
                if any(c.finish == "abort" for c in state.choices):
                    self._counts["requests_aborted"] += 1
                if self.config.remember_finished and all(c.finish is not None for c in state.choices):
                    self._finished[rid] = _ENCODER.encode([c.completion() for c in state.choices])
                    while len(self._finished) > self.config.remember_finished:
                        del self._finished[next(iter(self._finished))]
            finally:
                state.served.set()

    async def _run_choice(self, state: _Request, choice: _Choice) -> None:
        """Drive one choice to its end and hand the caller its final delta, or its error."""
        rid = state.request.request_id
        try:
            try:
                with anyio.move_on_after(self.config.request_timeout_s) as deadline:
                    finish = await self._drive(state, choice)
                if deadline.cancelled_caught:
                    raise EngineTimeoutError(
                        f"request {rid!r} choice {choice.index}: not finished within "
                        f"request_timeout_s={self.config.request_timeout_s} ({len(choice.ids)} tokens so far)"
                    )
            except Exception as exc:  # handed to the caller, who re-raises it
                _send(state, exc)
                return
            choice.finish = finish
            _send(
                state,
                TokenDelta(
                    index=choice.index, token_ids=[], logprobs=[], versions=[], finish_reason=finish,
                    cached_tokens=choice.cached,
                ),
            )
        finally:
            choice.done.set()

    async def _drive(self, state: _Request, choice: _Choice) -> FinishReason:
        """Run attempts of one choice until it finishes; returns its finish reason."""
        request = state.request
        sampling = request.sampling
        stop_ids = set(sampling.stop_token_ids)
        attempt = failures = 0
        avoid: _Cell | None = None
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
            cell = await self._wait_cell(state, choice, avoid)
            if cell is None:
                return "abort"
            seed = choice_seed(sampling.seed, choice.index)
            if seed is not None and attempt:
                seed = choice_seed(seed, attempt)  # a continuation is not a replay
            sub = GenerateRequest(
                request_id=f"{request.request_id}@{choice.index}.{attempt}",
                prompt_ids=[*request.prompt_ids, *choice.ids],
                sampling=msgspec.structs.replace(sampling, n=1, max_tokens=remaining, seed=seed),
            )
            leg = _Leg(cell, sub.request_id)
            cell.legs.add(leg)  # from here a drain or an abort reaches it
            choice.leg = leg
            self._counts["requests_routed"] += 1
            plan: ContinuationPlan | None = None
            try:
                try:
                    if attempt:
                        plan = await self.continuation.prepare(sub, source=source, target=cell.engine, carried=carried)
                        carried = None
                        sub = plan.request
                        self._counts["tokens_recomputed"] += plan.tokens_recomputed
                        if plan.tokens_loaded:
                            self._counts["requests_migrated"] += 1
                            self._counts["tokens_migrated"] += plan.tokens_loaded
                    await self._run_leg(state, choice, leg, sub, first=attempt == 0)
                except EngineError as exc:  # from the continuation strategy: a failed attempt
                    leg.error = exc
                leg.ended.set()
                if _continues(choice, leg, stop_ids):  # still registered here: a drain waits for it
                    so_far = msgspec.structs.replace(sub, prompt_ids=[*request.prompt_ids, *choice.ids], kv_import=None)
                    carried = await self.continuation.leave(so_far, source=cell.engine)
            finally:
                leg.ended.set()
                cell.legs.discard(leg)
                choice.leg = None
                cell.legs_changed.notify()
                if plan is not None:
                    with anyio.CancelScope(shield=True):
                        await self.continuation.release(plan, target=cell.engine)
            attempt += 1
            source, avoid = cell.engine, None
            if leg.finish in ("stop", "length"):
                return leg.finish
            if choice.user_aborted:
                return "abort"
            if isinstance(leg.error, InvalidRequestError):
                raise leg.error
            if leg.stop_reason == "redirect" or isinstance(leg.error, EngineUnavailableError):
                if isinstance(leg.error, EngineUnavailableError) and leg.stop_reason != "redirect":
                    self._mark_down(cell, f"attempt {leg.request_id!r} failed: {leg.error}")
                self._counts["requests_redirected"] += 1
                choice.moved_s = leg.stopped_s if leg.stopped_s is not None else anyio.current_time()
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
                    f"request {request.request_id!r} choice {choice.index}: {failures} failed attempts "
                    f"(max_retries={self.config.max_retries}); last on cell {cell.name!r}: {why}"
                )
            avoid = cell

    async def _wait_cell(self, state: _Request, choice: _Choice, avoid: _Cell | None) -> _Cell | None:
        """A rollout cell for the choice's next attempt (None once the caller aborted it); waits at
        most `no_cell_timeout_s` for one. Raises `EngineUnavailableError`."""
        with anyio.move_on_after(self.config.no_cell_timeout_s):
            while True:
                if choice.user_aborted:
                    return None
                cell = self._choose(state.session, avoid)
                if cell is not None:
                    return cell
                await self._cells_changed.wait()
        roles = {c.name: c.role if c.down is None else f"{c.role}, down: {c.down}" for c in self._cells.values()}
        raise EngineUnavailableError(
            f"request {state.request.request_id!r}: no rollout cell in service for "
            f"no_cell_timeout_s={self.config.no_cell_timeout_s}; cells: {roles}"
        )

    def _choose(self, session: str, avoid: _Cell | None) -> _Cell | None:
        serving = [c for c in self._cells.values() if c.serving]
        if not serving:
            return None
        pinned = self._pins.get(session)
        if pinned is not None and pinned.serving and pinned is not avoid:
            return pinned
        pool = [c for c in serving if c is not avoid] or serving
        best = min(pool, key=lambda c: (len(c.legs), c.executions, c.order))
        if pinned is not None:
            pinned.executions -= 1
        self._pins[session] = best
        best.executions += 1
        return best

    # -- attempts -------------------------------------------------------------------------------

    async def _run_leg(self, state: _Request, choice: _Choice, leg: _Leg, sub: GenerateRequest, *, first: bool) -> None:
        """Stream one attempt into the choice; on return the attempt has ended on its cell (or the
        cell could not be reached within `abort_timeout_s`)."""
        engine = leg.cell.engine
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
                                self._take(state, choice, leg, delta.token_ids, delta.logprobs, delta.versions)
                                if delta.finish_reason is not None:
                                    leg.finish = delta.finish_reason
                                    if first:
                                        choice.cached = delta.cached_tokens
                    except EngineError as exc:
                        leg.error = exc
                tg.cancel_scope.cancel()
        finally:
            if leg.finish is None and not leg.abort_sent:
                # the stream broke, or the caller went away: stop the attempt on its cell first
                with anyio.CancelScope(shield=True):
                    await self._abort_leg(leg)
            leg.ended.set()
        if leg.finish is None and leg.abort_result:
            done = leg.abort_result[0]  # what the cell sampled that its stream did not bring
            tail = slice(leg.streamed, None)
            self._take(state, choice, leg, done.token_ids[tail], done.logprobs[tail], done.versions[tail])
            if done.finish_reason != "abort":
                leg.finish = done.finish_reason

    def _take(
        self, state: _Request, choice: _Choice, leg: _Leg, ids: list[int], lps: list[float], vers: list[int]
    ) -> None:
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
        leg.streamed += len(ids)
        leg.last_token_s = now
        self._counts["tokens_generated"] += len(ids)
        _send(state, TokenDelta(index=choice.index, token_ids=list(ids), logprobs=list(lps), versions=list(vers)))

    async def _watch(self, leg: _Leg) -> None:
        """Stop the attempt if no token arrives for `attempt_timeout_s` (it is retried elsewhere)."""
        while (wake := leg.last_token_s + self.config.attempt_timeout_s) > anyio.current_time():
            await anyio.sleep(wake - anyio.current_time())
        await self._stop_leg(leg, "timeout")

    async def _stop_leg(self, leg: _Leg, reason: _StopReason) -> None:
        """Abort an attempt on its cell and wait (bounded) for its stream to end with the tokens so far."""
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

    async def _abort_leg(self, leg: _Leg) -> None:
        """`engine.abort` on the attempt's cell, at most `abort_timeout_s`; keeps what it returns.
        A cell that cannot abort is no longer listened to."""
        leg.abort_sent = True
        try:
            with anyio.fail_after(self.config.abort_timeout_s):
                leg.abort_result = await leg.cell.engine.abort(leg.request_id)
        except (EngineError, TimeoutError):  # unreachable or hung: its tokens so far are what was streamed
            leg.scope.cancel()

    # -- helpers --------------------------------------------------------------------------------

    def _cell(self, name: str) -> _Cell:
        cell = self._cells.get(name)
        if cell is None:
            raise ValueError(f"cell {name!r} is not in the router (cells: {sorted(self._cells)})")
        return cell

    def _mark_down(self, cell: _Cell, reason: str) -> None:
        cell.down = reason
        self._unpin_cell(cell)
        self._cells_changed.notify()

    def _unpin_cell(self, cell: _Cell) -> None:
        for session in [s for s, c in self._pins.items() if c is cell]:
            del self._pins[session]
        cell.executions = 0


class _ExecutionEngine:
    """The router as one execution sees it (`Router.engine_for`): an `InferenceEngine` whose
    requests carry the execution as their affinity key. Everything else is the router's."""

    def __init__(self, router: Router, execution_id: str) -> None:
        self.router = router
        self.execution_id = execution_id

    def generate(self, request: GenerateRequest) -> AsyncIterator[TokenDelta]:
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


def _continues(choice: _Choice, leg: _Leg, stop_ids: set[int]) -> bool:
    """Whether a choice goes on to another attempt after `leg` ended (see `Router._drive`)."""
    if leg.finish in ("stop", "length") or choice.user_aborted or isinstance(leg.error, InvalidRequestError):
        return False
    if choice.ids and choice.ids[-1] in stop_ids:
        return False
    return len(choice.ids) < choice.max_tokens


def _send(state: _Request, item: TokenDelta | Exception) -> None:
    """Hand an item to the request's caller (no checkpoint); nothing to do once the caller left."""
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        state.send.send_nowait(item)


def _check_role(role: str) -> None:
    if role not in _ROLES:
        raise ValueError(f"role={role!r} must be one of {_ROLES}")
