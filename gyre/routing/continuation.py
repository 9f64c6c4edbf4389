"""Continuations: how a choice that left one cell continues on another, and whether its KV moves.

Owns the `Continuation` seam the router calls when an attempt ends unfinished (a switch, a dead or
stalled cell) and the decision between migrating and recomputing: `ContinuationPlan` (the request
the target runs and the prefill it redoes), `RecomputeContinuation` (prefill prompt + tokens so
far) and `MigrateContinuation` (the source exports the KV, the target loads it, recompute when that
fails or the export was computed with other weights than the target serves), with its
`MigrationRecord` / `MigrationStatistics`. A migration counts only once the target's attempt
reported that it loaded the KV (`release` gets its final delta's `cached_tokens`); a target that
prefilled instead (its KV folder is not the source's: another host) is a missed import, recomputed.

Knows nothing about cells, roles or routing (the router picks source and target), nor how an
engine moves KV (`KVTransferEngine.export_kv` / `release_kv`; vLLM's side is
`gyre.engines.kv_transport`).
"""

from __future__ import annotations

from collections import deque
from typing import Literal, Protocol, runtime_checkable

import anyio
import msgspec

from gyre._counters import Counters
from gyre.engines.protocol import GenerateRequest, InferenceEngine, KVExport, KVTransferEngine
from gyre.errors import GyreError

__all__ = [
    "Continuation",
    "ContinuationPlan",
    "RecomputeContinuation",
    "MigrateContinuation",
    "MigrationRecord",
    "MigrationStatistics",
]


class ContinuationPlan(msgspec.Struct, frozen=True, kw_only=True):
    """How a target cell continues a choice: the request it runs and the prefill work it redoes."""

    request: GenerateRequest
    """What the target runs: prompt + tokens so far, max_tokens reduced, the attempt's seed."""
    tokens_recomputed: int
    """Tokens the target prefills again because no KV came along (before its own prefix-cache
    hits)."""
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
    3. `release` runs (shielded) once the attempt that ran the plan ended, with the prompt tokens
       its final delta reported cached (`TokenDelta.cached_tokens`, None when it reported none):
       free what was exported, and return how many tokens of KV the target loaded from it.
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

    async def release(
        self, plan: ContinuationPlan, *, target: InferenceEngine, cached_tokens: int | None
    ) -> int: ...


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

    async def release(
        self, plan: ContinuationPlan, *, target: InferenceEngine, cached_tokens: int | None
    ) -> int:
        return 0


class MigrationRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What happened to one continuation under `MigrateContinuation`."""

    request_id: str
    """The continuation attempt's request ID (`{request}@{choice}.{attempt}`)."""
    outcome: Literal["migrated", "recomputed"]
    """`migrated` once the target's attempt reported the exported tokens cached (at `release`)."""
    sequence_tokens: int
    """Prompt + tokens so far: the context the target continues from."""
    tokens_moved: int
    """Tokens whose KV the target loads (0 when recomputed)."""
    export_s: float
    """Seconds spent exporting on the source (0 when no export was tried)."""
    reason: str | None = None
    """Why it was recomputed (export failed or timed out, weights differ, the target did not load
    the export, ...); None when migrated."""


class MigrationStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Counters of a `MigrateContinuation` (docs/style.md rule 6)."""

    migrated: int
    """Continuations whose target loaded the exported KV: its attempt's final delta reported at
    least the export's tokens cached."""
    recomputed: int
    """Continuations that fell back to recompute (`imports_missed` included)."""
    imports_missed: int
    """Continuations handed an export that their target did not load: it reported fewer cached
    tokens than the export holds, or none (it prefilled instead: e.g. its KV folder is not the
    source's, or its attempt ended first). Recovered from: recomputed, counted."""
    tokens_moved: int
    """Tokens of KV targets loaded."""
    export_s_total: float
    """Seconds spent in exports (successful or not)."""
    export_s_max: float
    """Longest export, seconds."""
    exports_failed: int
    """Exports that failed or timed out (their continuations recomputed)."""
    exports_stale: int
    """Exports computed with other weights than the target served (their continuations
    recomputed, the exports released): stale KV is never handed to a target."""
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
    `export_timeout_s`, the target is no `KVTransferEngine`, or the export was computed with other
    weights than the target serves now (`exports_stale`; should the target's weights change after
    this check, the target engine itself refuses the import and prefills). A plan that hands the
    target an export counts as migrated only when `release` learns the target loaded it (its
    attempt's `cached_tokens` >= the export's tokens); otherwise as a missed import, recomputed
    (`imports_missed`: a target whose folder is not the source's prefills quietly). An export whose
    continuation never ran is deleted by the store's lease (`KVTransferConfig.lease_s`).

    Args:
        export_timeout_s: longest export on the source; keep it below `RouterConfig.abort_timeout_s`
            (a drain waits for it).
        release_timeout_s: longest wait for deleting an export.
        keep_records: how many `MigrationRecord`s `statistics()` keeps.
    Raises `ValueError` for a non-positive timeout or a negative `keep_records`.
    """

    def __init__(
        self,
        *,
        export_timeout_s: float = 20.0,
        release_timeout_s: float = 5.0,
        keep_records: int = 256,
    ) -> None:
        if export_timeout_s <= 0 or release_timeout_s <= 0:
            raise ValueError(f"{export_timeout_s=} and {release_timeout_s=} must be > 0")
        if keep_records < 0:
            raise ValueError(f"{keep_records=} must be >= 0")
        self.export_timeout_s = export_timeout_s
        self.release_timeout_s = release_timeout_s
        self._records: deque[MigrationRecord] = deque(maxlen=keep_records)
        self._counts = Counters(
            "migrated",
            "recomputed",
            "imports_missed",
            "tokens_moved",
            "exports_failed",
            "exports_stale",
            "released",
            "release_failed",
        )
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
                self._counts["exports_stale"] += 1
                reason = (
                    f"export computed with weight version {carried.weight_version}, "
                    f"target at {target.statistics().weight_version}"
                )
            else:  # recorded by `release`, once the target's attempt says whether it loaded it
                return ContinuationPlan(
                    request=msgspec.structs.replace(request, kv_import=carried),
                    tokens_recomputed=n - carried.tokens,
                    tokens_loaded=carried.tokens,
                    export=carried,
                )
            await self._delete(carried, target)
        self._record(
            MigrationRecord(
                request_id=request.request_id,
                outcome="recomputed",
                sequence_tokens=n,
                tokens_moved=0,
                export_s=export_s,
                reason=reason,
            )
        )
        return ContinuationPlan(request=request, tokens_recomputed=n)

    async def release(
        self, plan: ContinuationPlan, *, target: InferenceEngine, cached_tokens: int | None
    ) -> int:
        """Record whether the target loaded the plan's export and delete it (bounded by
        `release_timeout_s`; a failed delete is counted and left to the store's lease).

        Args:
            cached_tokens: prompt tokens the target's attempt reported served from cache (its
                final delta's `cached_tokens`), None when it reported none.
        Returns the tokens of KV the target loaded: the export's tokens when `cached_tokens`
        covers them, else 0 (no export in the plan, or a missed import, counted).
        """
        export = plan.export
        if export is None:
            return 0
        loaded = cached_tokens is not None and cached_tokens >= export.tokens
        n = len(plan.request.prompt_ids)
        if loaded:
            record = MigrationRecord(
                request_id=plan.request.request_id,
                outcome="migrated",
                sequence_tokens=n,
                tokens_moved=export.tokens,
                export_s=export.seconds,
            )
        else:
            self._counts["imports_missed"] += 1
            record = MigrationRecord(
                request_id=plan.request.request_id,
                outcome="recomputed",
                sequence_tokens=n,
                tokens_moved=0,
                export_s=export.seconds,
                reason=(
                    f"target did not load the export: {cached_tokens} prompt tokens cached, "
                    f"the export holds {export.tokens} (another KV folder than the source's, "
                    "or its attempt ended first)"
                ),
            )
        self._record(record)
        await self._delete(export, target)
        return record.tokens_moved

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
            export_s_total=self._export_s_total,
            export_s_max=self._export_s_max,
            records=tuple(self._records),
            **self._counts,
        )
