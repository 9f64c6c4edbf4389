"""The engine seams: the inference-engine protocol and the trainer protocol.

Inference: `SamplingParams`, `GenerateRequest`, `TokenDelta`, `Completion`, `EngineStatistics`,
the `InferenceEngine` protocol (vLLM backend, cell client, scripted fake) and the optional
`KVTransferEngine` capability (`KVExport`). An engine knows only token IDs, never chat messages,
tools or executions; its behaviour logprobs are those of the distribution actually sampled from
(docs/design.md invariant 2), and every token carries the weight version that sampled it. Training:
the `Trainer` protocol and its records (`AccumulateStatistics`, `StepStatistics`,
`TrainStatistics`, `TrainerStatistics`); a trainer knows a micro-batch only as a `MicroBatch` and
its loss only as the `Objective` its caller hands it, never trees, advantages or the policy loss.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import msgspec

if TYPE_CHECKING:
    import torch

__all__ = [
    "FinishReason",
    "StructuredOutput",
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
    "MicroBatch",
    "ObjectiveStatistics",
    "Objective",
    "AccumulateStatistics",
    "mismatch_split",
    "StepStatistics",
    "TrainStatistics",
    "TrainerStatistics",
    "Trainer",
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
    min_p: float = 0.0
    """Drop tokens less likely than min_p times the most likely one, in [0, 1]; 0 disables it
    (vLLM's `min_p`: truncation, like top-k and top-p)."""
    seed: int | None = None
    """Base seed; choice i samples with `choice_seed(seed, i)` so n > 1 choices differ (B22)."""
    stop_token_ids: tuple[int, ...] = ()
    """Sampling one of these ends the choice with `stop`; the token is kept with its logprob."""
    n: int = 1
    """Number of independent choices for the prompt."""
    top_logprobs: int = 0
    """Also return the k most likely tokens and their logprobs at every position (0: none; at
    most 20). They come from the same distribution as the behaviour logprobs."""
    logit_bias: dict[int, float] | None = None
    """Token ID -> value added to its logit before sampling, in [-100, 100] (OpenAI's
    `logit_bias`)."""
    presence_penalty: float = 0.0
    """Subtracted once from the logit of every token already in the completion, in [-2, 2]."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit per occurrence in the completion so far, in [-2, 2]."""
    repetition_penalty: float = 1.0
    """vLLM's multiplicative penalty (> 0; 1 disables it) on tokens in the prompt or completion."""
    structured: StructuredOutput | None = None
    """A grammar every completion must match (tokens it forbids are masked before sampling)."""
    min_tokens: int = 0
    """The stop token IDs are masked until this many tokens are sampled (vLLM's `min_tokens`)."""
    allowed_token_ids: tuple[int, ...] | None = None
    """Only these token IDs may be sampled (the others are masked); None allows every one."""
    bad_words: tuple[str, ...] = ()
    """Texts never sampled: the token that would complete one (tokenized by the engine's
    tokenizer, with and without a leading space) is masked (vLLM's `bad_words`)."""


class StructuredOutput(msgspec.Struct, frozen=True, kw_only=True):
    """A constraint on the completion's text, enforced by masking tokens before sampling.

    The behaviour logprobs of a constrained request are those of the masked distribution (the one
    sampled from). `kind` and `spec` follow vLLM's `StructuredOutputsParams`
    (docs.vllm.ai, "Structured Outputs"):

    - `json_schema`: `spec` is a JSON schema (JSON text); the completion is one JSON value
      matching it;
    - `json_object`: any JSON object (`spec` is empty);
    - `regex`: `spec` is a regular expression the whole completion matches;
    - `grammar`: `spec` is an EBNF grammar (xgrammar's dialect, rule `root`) the completion
      matches;
    - `structural_tag`: `spec` is an xgrammar structural tag (JSON text, `{"type":
      "structural_tag", "format": ...}`; xgrammar docs, "Structural Tag"), e.g. tool calls in a
      model's own tags.

    Generation ends with a stop token only where the grammar may end.
    """

    kind: Literal["json_schema", "json_object", "regex", "grammar", "structural_tag"]
    spec: str = ""


class GenerateRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One generate call: a prompt of token IDs and how to sample from it."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams = SamplingParams()
    kv_import: KVExport | None = None
    """KV migration: load this export instead of prefilling; `prompt_ids` must be its exact
    sequence. Loaded only by an engine serving the weight version that computed it (another one
    prefills, counted in `kv_imports_refused`); engines without KV transfer ignore it; a failed load
    is recomputed."""


class TokenDelta(msgspec.Struct, frozen=True, kw_only=True, array_like=True, gc=False):
    """New tokens of one choice, streamed as they are sampled.

    `token_ids`, `logprobs` and `versions` have equal length (possibly 0 on the final delta);
    `finish_reason` is set on the last delta of the choice and None before it. Without top
    logprobs their two fields cost one byte each on the wire (msgpack nil).
    """

    index: int
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: FinishReason | None = None
    cached_tokens: int | None = None
    """On the final delta: prompt tokens served from the prefix cache (None if unknown)."""
    top_ids: list[list[int]] | None = None
    """With `SamplingParams.top_logprobs` k > 0: per token, the k most likely token IDs, most
    likely first (fewer where the constraint allows fewer); None otherwise (nothing on the
    wire)."""
    top_logprobs: list[list[float]] | None = None
    """Their logprobs (nats), shaped like `top_ids`."""

    def then(self, later: TokenDelta) -> TokenDelta:
        """This delta and `later`, the next of the same choice, as one (`later`'s finish and
        cached tokens). Raises `ValueError` for another choice or after this one's finish."""
        if later.index != self.index or self.finish_reason is not None:
            raise ValueError(f"delta of choice {later.index} cannot follow {self!r}")
        tops = self.top_ids is not None
        return TokenDelta(
            index=self.index,
            token_ids=self.token_ids + later.token_ids,
            logprobs=self.logprobs + later.logprobs,
            versions=self.versions + later.versions,
            finish_reason=later.finish_reason,
            cached_tokens=later.cached_tokens,
            top_ids=self.top_ids + (later.top_ids or []) if self.top_ids is not None else None,
            top_logprobs=(self.top_logprobs or []) + (later.top_logprobs or []) if tops else None,
        )


class Completion(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one choice produced: IDs, behaviour logprobs (nats), weight version per token."""

    index: int
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: FinishReason
    top_ids: list[list[int]] | None = None
    """As `TokenDelta.top_ids`, for every token."""
    top_logprobs: list[list[float]] | None = None


class EngineStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of an engine's state (docs/style.md rule 6)."""

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
    kv_imports: int = 0
    """Requests that asked the KV connector to load an export (`GenerateRequest.kv_import`)."""
    kv_imports_refused: int = 0
    """Imports not loaded because the export was computed with other weights than the engine
    serves: the request prefilled instead (stale KV is never loaded)."""


@runtime_checkable
class InferenceEngine(Protocol):
    """What every engine implements: vLLM in a cell, the cell client, the scripted fake.

    Errors: `InvalidRequestError` (bad prompt or sampling, names the value),
    `EngineUnavailableError` (paused, shut down), `EngineTimeoutError`, `WeightSyncError`.
    """

    def generate(self, request: GenerateRequest) -> AsyncGenerator[TokenDelta, None]:
        """Stream the choices' tokens; every choice ends with exactly one delta with a finish
        reason."""
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
        """Stop scheduling (vLLM sleep where supported); in-flight requests wait, new ones are
        refused."""
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
    """Leading tokens of the sequence whose KV was stored: whole blocks, at least
    len - block_size."""
    sequence_tokens: int
    """Length of the exported sequence; an engine asked to continue exactly it loads `tokens`."""
    bytes: int
    """Size of the export in the shared store (0 for NIXL: nothing is copied until the target
    pulls)."""
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
    top_ids: dict[int, list[list[int]]] = {}
    top_lps: dict[int, list[list[float]]] = {}
    async for delta in engine.generate(request):
        ids.setdefault(delta.index, []).extend(delta.token_ids)
        lps.setdefault(delta.index, []).extend(delta.logprobs)
        vers.setdefault(delta.index, []).extend(delta.versions)
        if delta.top_ids is not None and delta.top_logprobs is not None:
            top_ids.setdefault(delta.index, []).extend(delta.top_ids)
            top_lps.setdefault(delta.index, []).extend(delta.top_logprobs)
        if delta.finish_reason is not None:
            finish[delta.index] = delta.finish_reason
    k = request.sampling.top_logprobs
    return [
        Completion(
            index=i,
            token_ids=ids[i],
            logprobs=lps[i],
            versions=vers[i],
            finish_reason=finish[i],
            top_ids=top_ids.get(i, []) if k else None,
            top_logprobs=top_lps.get(i, []) if k else None,
        )
        for i in sorted(finish)
    ]


class MicroBatch(Protocol):
    """What a trainer knows of a micro-batch (a `gyre.trajectory.PackedBatch` is one); the
    objective reads the rest."""

    @property
    def execution_ids(self) -> Sequence[str]:
        """The executions whose tokens the micro-batch holds; each needs an entry in the
        advantages of `Trainer.accumulate`."""
        ...

    @property
    def num_tokens(self) -> int:
        """Tokens forwarded (a packed tree's shared prefixes once)."""
        ...


class ObjectiveStatistics(Protocol):
    """What a trainer reads of an objective's statistics (`gyre.rl.LossStatistics` is one)."""

    @property
    def tokens(self) -> int:
        """Tokens that carried loss."""
        ...

    @property
    def mean_ratio(self) -> float:
        """Mean importance ratio pi_trainer / pi_behaviour over those tokens (NaN when none)."""
        ...

    @property
    def mean_abs_logprob_diff(self) -> float:
        """Mean |trainer logprob - behaviour logprob| over those tokens, nats (NaN when none)."""
        ...


class Objective(Protocol):
    """The loss a trainer minimises, handed to it by its caller (`gyre.rl.PolicyObjective`)."""

    def __call__(
        self,
        model: torch.nn.Module,
        batch: Any,
        advantages: Mapping[str, float | None],
        *,
        version: int,
        attention: Literal["sdpa", "flex"] = "sdpa",
        logprob_impl: Literal["torch", "triton"] = "torch",
    ) -> tuple[torch.Tensor, ObjectiveStatistics]:
        """Loss of one micro-batch `batch` (a `MicroBatch`) under `model`: a differentiable scalar
        tensor whose gradients add up over a batch's micro-batches, and its statistics.
        `advantages` maps each execution id to its advantage (None: no loss); `version` is the
        trainer's weight version (the staleness reference); `attention` and `logprob_impl` are
        the trainer's kernels (`TrainerConfig`). Raises `ValueError` on bad input."""
        ...


class AccumulateStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What one `accumulate` call did; sums, so that the node can combine several calls exactly."""

    micro_batches: int
    tokens: int
    """Packed tokens forwarded (shared prefixes once)."""
    policy_tokens: int
    """Tokens that carried loss."""
    loss: float
    """Sum of the micro-batch losses (non-finite when one of them was)."""
    logprob_abs_diff_sum: float
    """Sum over counted loss tokens of |trainer logprob - behaviour logprob| (nats)."""
    ratio_sum: float
    """Sum over counted loss tokens of the importance ratio pi_trainer / pi_behaviour."""
    counted: int
    """Loss tokens in the two sums above (divide by it for means)."""
    same_version_abs_diff_sum: float = 0.0
    """The part of `logprob_abs_diff_sum` over tokens sampled by the trainer's own weight
    version (numerics, not staleness)."""
    same_version_counted: int = 0
    """Loss tokens in `same_version_abs_diff_sum`."""
    finite: bool
    """False when a micro-batch loss was non-finite (the next `apply_step` will skip)."""


def mismatch_split(stats: Sequence[AccumulateStatistics]) -> dict[str, float]:
    """`same_version_abs_diff_mean` and `stale_abs_diff_mean` of one or more `accumulate` calls:
    the mean |trainer - behaviour logprob| over tokens sampled by the trainer's own weight version
    (numerics) and over older ones (numerics plus off-policy drift); NaN where no token was."""
    total = sum(s.logprob_abs_diff_sum for s in stats)
    counted = sum(s.counted for s in stats)
    same = sum(s.same_version_abs_diff_sum for s in stats)
    same_counted = sum(s.same_version_counted for s in stats)
    stale_counted = counted - same_counted
    return {
        "same_version_abs_diff_mean": same / same_counted if same_counted else float("nan"),
        "stale_abs_diff_mean": (total - same) / stale_counted if stale_counted else float("nan"),
    }


class StepStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What one `apply_step` did."""

    version: int
    """Weight version after the call (bumped only when the step was applied)."""
    applied: bool
    """False when a non-finite loss or gradient skipped the step."""
    grad_norm: float | None
    """Global gradient norm before clipping (None when skipped, or where DeepSpeed reports none:
    ZeRO stage 0)."""


class TrainStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What one `train_batch` did."""

    version: int
    """Weight version after the call (bumped only when the step was applied)."""
    applied: bool
    """False when a non-finite loss or gradient skipped the step."""
    micro_batches: int
    tokens: int
    """Packed tokens forwarded (shared prefixes once)."""
    policy_tokens: int
    """Tokens that carried loss."""
    loss: float
    """Sum of the micro-batch losses (the batch loss; non-finite when the step was skipped for
    it)."""
    grad_norm: float | None
    """Global gradient norm before clipping (None when skipped)."""
    logprob_abs_diff_mean: float
    """Mean |trainer logprob - behaviour logprob| over loss tokens (the off-policy mismatch)."""
    same_version_abs_diff_mean: float = float("nan")
    """The same over tokens sampled by the trainer's own weight version: numerics (engine against
    trainer on the same weights); NaN when there were none."""
    stale_abs_diff_mean: float = float("nan")
    """The same over older tokens: numerics plus off-policy drift; NaN when there were none."""
    mean_ratio: float
    """Mean importance ratio pi_trainer / pi_behaviour over loss tokens (1 when on-policy)."""


class TrainerStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of a trainer's state (docs/style.md rule 6)."""

    version: int
    """Weight version of the trainer's weights."""
    has_gradients: bool
    """Gradients are held that no step, send or `zero_grad` consumed yet."""
    num_parameters: int
    """P: parameters of the model (the length of a gradient vector)."""
    steps_applied: int
    """Optimizer steps applied since start."""
    steps_skipped: int
    """Steps skipped for a non-finite loss or gradient since start."""
    micro_batches: int
    """Micro-batches forwarded and backpropagated since start."""
    tokens: int
    """Tokens those micro-batches forwarded."""
    gradient_vectors_added: int
    """Flat gradients added with `add_gradient_vector` since start (a core's satellite traffic)."""


@runtime_checkable
class Trainer(Protocol):
    """What the runtime asks of a trainer (the DeepSpeed trainer in a cell or in the one-cell loop).

    Blocking: every method runs torch work; call it from a worker thread, never on an event loop.
    A step is `accumulate` (or `add_gradient_vector`) then `apply_step`; `train_batch` is both.
    """

    version: int
    """Weight version of the trainer's weights (bumped by every applied step)."""

    @property
    def has_gradients(self) -> bool:
        """True between an `accumulate` / `add_gradient_vector` and the next `apply_step` /
        `zero_grad`."""
        ...

    @property
    def num_parameters(self) -> int:
        """P: the length of `gradient_vector()`."""
        ...

    @property
    def grad_dtype(self) -> torch.dtype:
        """dtype of `gradient_vector()`."""
        ...

    def train_batch(
        self, micro_batches: Sequence[MicroBatch], advantages: Mapping[str, float | None]
    ) -> TrainStatistics:
        """`accumulate` then `apply_step`: one optimizer step on one batch."""
        ...

    def accumulate(
        self,
        micro_batches: Sequence[MicroBatch],
        advantages: Mapping[str, float | None],
        *,
        passes: int | None = None,
    ) -> AccumulateStatistics:
        """Forward/backward every micro-batch under the trainer's objective, adding its gradient to
        the accumulation; no step. `passes` (one rank of a ZeRO-3 group): run that many, the rest
        zero, so every rank runs the same collectives. `ValueError` for no micro-batches or a
        missing advantage."""
        ...

    def gradient_vector(self) -> torch.Tensor:
        """The accumulated gradient, flat: [P] of `grad_dtype` (a satellite sends it)."""
        ...

    def add_gradient_vector(self, vec: torch.Tensor) -> None:
        """Add a flat gradient [P] (another trainer's `gradient_vector`) into the accumulation."""
        ...

    def apply_step(self, *, finite: bool = True) -> StepStatistics:
        """One optimizer step on what was accumulated (skipped when anything is non-finite), then
        `zero_grad`."""
        ...

    def zero_grad(self) -> None:
        """Drop the accumulated gradients."""
        ...

    def load_weights(self, snapshot_dir: str | Path, version: int) -> None:
        """Load a weight snapshot (as `save_snapshot` writes) and tag it `version`; the optimizer
        state is untouched."""
        ...

    def save_snapshot(self, root: str | Path) -> Path:
        """Write the weights as a Hugging Face folder `root/v<version>` for the engines; returns
        it."""
        ...

    def save_checkpoint(self, path: str | Path) -> None:
        """Weights, optimizer state and version at `path`."""
        ...

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore what `save_checkpoint` wrote; `FileNotFoundError` if there is none."""
        ...

    def statistics(self) -> TrainerStatistics:
        """A snapshot of the trainer's counters."""
        ...
