"""The inference-engine protocol: token IDs in, sampled token IDs with behaviour logprobs out.

Owns `SamplingParams`, `GenerateRequest`, `TokenDelta`, `Completion`, `EngineStatistics` and the
`InferenceEngine` protocol that the vLLM backend, the cell client and the scripted fake all
implement, plus the optional `KVTransferEngine` capability (`KVExport`): KV-cache migration. The engine knows nothing about chat messages, tools or executions: only token IDs.

Behaviour logprobs are those of the distribution actually sampled from: after temperature, top-k
and top-p (DESIGN.md invariant 2). Every token carries the weight version that sampled it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal, Protocol, runtime_checkable

import msgspec

__all__ = [
    "FinishReason",
    "SamplingParams",
    "GenerateRequest",
    "TokenDelta",
    "Completion",
    "EngineStatistics",
    "InferenceEngine",
    "KVExport",
    "KVTransferEngine",
    "choice_seed",
    "collect",
]

FinishReason = Literal["stop", "length", "abort"]
"""`stop`: a stop token ID was sampled (it is included); `length`: max_tokens (or the context
limit) was reached, nothing appended; `abort`: the request was aborted, tokens so far returned."""


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """How to sample one request. Validated by the engine (`InvalidRequestError`), not here."""

    max_tokens: int = 256
    """Most completion tokens per choice."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus mass in (0, 1]; 1 disables it."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 disables it."""
    seed: int | None = None
    """Base seed; choice i samples with `choice_seed(seed, i)` so n > 1 choices differ (B22)."""
    stop_token_ids: tuple[int, ...] = ()
    """Sampling one of these ends the choice with `stop`; the token is kept with its logprob."""
    n: int = 1
    """Number of independent choices for the prompt."""


class GenerateRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One generate call: a prompt of token IDs and how to sample from it."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams = SamplingParams()
    kv_import: KVExport | None = None
    """KV migration: load this export instead of prefilling; `prompt_ids` must be its exact
    sequence. Engines without KV transfer (and the shared-folder connector, which finds exports by
    their tokens) ignore it; a failed load is recomputed."""


class TokenDelta(msgspec.Struct, frozen=True, kw_only=True, array_like=True, gc=False):
    """New tokens of one choice, streamed as they are sampled.

    `token_ids`, `logprobs` and `versions` have equal length (possibly 0 on the final delta);
    `finish_reason` is set on the last delta of the choice and None before it.
    """

    index: int
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: FinishReason | None = None
    cached_tokens: int | None = None
    """On the final delta: prompt tokens served from the prefix cache (None if unknown)."""


class Completion(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one choice produced: IDs, behaviour logprobs (nats), weight version per token."""

    index: int
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: FinishReason


class EngineStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of an engine's state (STYLE.md rule 6)."""

    weight_version: int
    """Version of the weights now loaded."""
    running_requests: int
    """Requests accepted and not yet finished."""
    paused: bool
    """True between `pause()` and `resume()`; new requests are refused meanwhile."""
    requests_total: int
    """Requests accepted since start."""
    requests_aborted: int
    """Requests that ended with `abort`."""
    tokens_generated: int
    """Completion tokens produced since start."""
    weight_loads: int
    """Successful `load_weights` calls."""
    prefix_cache_resets: int
    """Prefix-cache resets (one after every weight load)."""
    max_model_len: int
    """Longest prompt + completion the engine accepts, in tokens."""
    vocab_size: int
    """Number of token IDs the model accepts."""
    prompt_tokens_computed: int = 0
    """Prompt tokens the model prefilled (not served by the prefix cache or the KV connector)."""
    kv_tokens_loaded: int = 0
    """Prompt tokens of KV imports (`GenerateRequest.kv_import`) served without prefill: loaded
    through the KV connector, or already in this engine's prefix cache (vLLM reports no split)."""
    kv_exports: int = 0
    """Successful `export_kv` calls."""
    kv_tokens_exported: int = 0
    """Tokens whose KV those exports stored."""
    kv_released: int = 0
    """Exports deleted by `release_kv` (after their import)."""
    kv_expired: int = 0
    """Exports deleted because their lease ran out (`KVTransferConfig.lease_s`)."""


@runtime_checkable
class InferenceEngine(Protocol):
    """What every engine implements: vLLM in a cell, the cell client, the scripted fake.

    Errors: `InvalidRequestError` (bad prompt or sampling, names the value),
    `EngineUnavailableError` (paused, shut down), `EngineTimeoutError`, `WeightSyncError`.
    """

    def generate(self, request: GenerateRequest) -> AsyncIterator[TokenDelta]:
        """Stream the choices' tokens; every choice ends with exactly one delta with a finish reason."""
        ...

    async def abort(self, request_id: str) -> list[Completion]:
        """Stop a request; return each choice's tokens so far (finish reason `abort` unless it had
        already finished). Unknown or finished request IDs return an empty list."""
        ...

    async def load_weights(self, snapshot: str, version: int) -> None:
        """Load the weights saved at `snapshot` (a Hugging Face folder) and tag them `version`.

        In-flight requests continue under the new weights: tokens sampled before carry the old
        version, tokens after the new one. The prefix cache is reset before any new token."""
        ...

    async def pause(self) -> None:
        """Stop scheduling (vLLM sleep where supported); in-flight requests wait, new ones are refused."""
        ...

    async def resume(self) -> None:
        """Undo `pause()`."""
        ...

    def statistics(self) -> EngineStatistics:
        """A snapshot of the engine's counters."""
        ...


class KVExport(msgspec.Struct, frozen=True, kw_only=True):
    """The KV cache of one token sequence, stored by `export_kv` for another engine to load."""

    key: str
    """Name of the export in the shared store (hex digest of the stored token IDs)."""
    tokens: int
    """Leading tokens of the sequence whose KV was stored: whole blocks, at least len - block_size."""
    sequence_tokens: int
    """Length of the exported sequence; an engine asked to continue exactly it loads `tokens`."""
    bytes: int
    """Size of the export in the shared store (0 for NIXL: nothing is copied until the target pulls)."""
    weight_version: int
    """Weights the KV was computed with; only an engine on the same version may load it."""
    seconds: float
    """Wall time of the export on the exporting engine."""
    transfer_params: dict[str, Any] | None = None
    """What the loading engine needs to find the KV (NIXL: the source engine, its blocks, its
    address); None for the shared folder."""


@runtime_checkable
class KVTransferEngine(Protocol):
    """An engine that can hand a sequence's KV cache to another engine (KV migration).

    The receiving engine needs no call: a generate request whose prompt is exactly the exported
    sequence and whose `kv_import` is the export loads the KV instead of prefilling it (its
    `kv_tokens_loaded` grows).
    Errors: `EngineUnavailableError` (no KV connector configured, paused, shut down),
    `InvalidRequestError` (sequence too short or too long), `EngineTimeoutError`.
    """

    async def export_kv(self, token_ids: list[int]) -> KVExport:
        """Store the KV of `token_ids` (a finished or aborted request's prompt + completion)."""
        ...

    async def release_kv(self, key: str) -> bool:
        """Delete export `key` from the shared store; False if it was already gone."""
        ...


_SEED_MIX = 0x9E3779B97F4A7C15  # 2**64 / golden ratio (Knuth's multiplicative hashing)


def choice_seed(seed: int | None, index: int) -> int | None:
    """Seed of choice `index` of a request seeded `seed`: distinct per choice, stable on repeat.

    Choice 0 keeps the request's seed, so n=1 requests sample exactly as seeded.
    """
    if seed is None:
        return None
    if index == 0:
        return seed
    return (seed * 1_000_003 + index * _SEED_MIX) % (2**63 - 1)


async def collect(engine: InferenceEngine, request: GenerateRequest) -> list[Completion]:
    """Run `request` to the end and return one `Completion` per choice, ordered by index."""
    ids: dict[int, list[int]] = {}
    lps: dict[int, list[float]] = {}
    vers: dict[int, list[int]] = {}
    finish: dict[int, FinishReason] = {}
    async for delta in engine.generate(request):
        ids.setdefault(delta.index, []).extend(delta.token_ids)
        lps.setdefault(delta.index, []).extend(delta.logprobs)
        vers.setdefault(delta.index, []).extend(delta.versions)
        if delta.finish_reason is not None:
            finish[delta.index] = delta.finish_reason
    return [
        Completion(index=i, token_ids=ids[i], logprobs=lps[i], versions=vers[i], finish_reason=finish[i])
        for i in sorted(finish)
    ]
