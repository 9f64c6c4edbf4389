"""Model-call records: the exact tokens of every call an agent made, as the TITO proxy saw them.

Owns `Role`, `Divergence`, `ModelCall` (one record per choice of one model call, in reference
form: the parent call it extends, how many of the parent's tokens it shares, its own new prompt
tokens), `FullCall` (the same record with its whole prompt, made only on demand),
`ExecutionTokens` (an execution's full sequences rebuilt from references, on demand),
`to_reference` and `ExecutionSummary`. Records of one execution hold O(its tokens), never
O(calls x history). The trajectory tree is built from these records only; the append-only log
that stores them lives beside them. Records know nothing about HTTP, chat messages or trees.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import msgspec

from gyre.engines.protocol import FinishReason, SamplingParams

__all__ = [
    "Role",
    "ROLES",
    "Divergence",
    "ModelCall",
    "FullCall",
    "ExecutionTokens",
    "to_reference",
    "common_prefix_len",
    "ExecutionSummary",
]

Role = Literal["main", "main_summary", "sub_agent", "sub_agent_summary"]
ROLES: tuple[Role, ...] = ("main", "main_summary", "sub_agent", "sub_agent_summary")
"""Roles in priority order for Jmax selection (docs/design.md: main > main summary > sub-agent >
...)."""


class Divergence(msgspec.Struct, frozen=True, kw_only=True):
    """Why a call's prompt is not `parent prompt + parent completion + new tokens`."""

    parent_call_id: str
    """The earlier call the prompt was compared with."""
    index: int
    """First token index where the prompt differs from the parent's prompt + completion."""
    reason: str
    """What the agent changed: `history_rewritten`, `template_dropped_reasoning`,
    `tool_arguments_reserialized`, `reasoning_dropped`, `invalid_utf8`, `message_edited`,
    `compaction`, `tools_changed`, ... (with `proxy.history = "heal"` the first four only where
    healing could not apply: `gyre.tito.heal`)."""


class _Call(msgspec.Struct, frozen=True, kw_only=True):
    """The fields every form of a model call has (all but its prompt)."""

    execution_id: str
    call_id: str
    """Unique within the execution; `<call>` or `<call>/<choice>` for n > 1."""
    role: Role
    completion_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: FinishReason
    parent_call_id: str | None = None
    """The call whose prompt + completion this prompt extends or branches off (None for a call
    that starts a context of its own)."""
    choice_index: int = 0
    sampling: SamplingParams = SamplingParams()
    started_s: float = 0.0
    """Unix time the proxy received the request, seconds."""
    finished_s: float = 0.0
    """Unix time the last token was returned, seconds."""
    divergence: Divergence | None = None
    """Set when the agent rewrote history and the prompt branches off the parent."""
    heals: tuple[str, ...] = ()
    """Client habits healed so that this prompt extends its parent's prompt + completion
    (`gyre.tito.heal.HEAL_REASONS`: `reasoning_dropped`, `tool_arguments_reserialized`,
    `invalid_utf8`, `reply_dropped`); empty when the history matched as sent. Logs written
    before the field existed read as empty."""


class ModelCall(_Call, frozen=True, kw_only=True):
    """One choice of one model call, exactly as sampled (TITO: never re-tokenized), in reference
    form.

    The prompt is `(parent prompt + parent completion)[:shared_len] + prompt_tail`: a call that
    extends its parent shares all of the parent's tokens, one that branches off shares the
    tokens before the divergence index, one without a parent shares none. `shared_len` is the
    longest common prefix (a record made by the proxy or `to_reference` guarantees it), so a
    call holds only its own new tokens; `ExecutionTokens` rebuilds whole prompts on demand.
    `completion_ids`, `logprobs` and `versions` have equal length; logprobs are behaviour
    logprobs in nats of the distribution sampled from; `versions` the weight version per token.
    """

    shared_len: int = 0
    """Leading tokens of the parent's prompt + completion this prompt starts with (0 without a
    parent)."""
    prompt_tail: list[int]
    """The prompt's token IDs after the first `shared_len`."""

    @property
    def prompt_len(self) -> int:
        """Length of the whole prompt, tokens."""
        return self.shared_len + len(self.prompt_tail)


class FullCall(_Call, frozen=True, kw_only=True):
    """A model call with its whole prompt (`prompt_ids`): what `ExecutionTokens.full_call` and
    `GET /gyre/v1/executions/{id}/calls?full=1` return, and how call logs written before the
    reference form stored a call. O(prompt) per call: never held for a whole execution on the
    hot path."""

    prompt_ids: list[int]


_FIELDS = _Call.__struct_fields__
_CHUNK = 1024


def common_prefix_len(a: bytes | list[int], b: bytes | list[int]) -> int:
    """Length of the longest common prefix of two token lists or byte strings (slices compared
    in C)."""
    n = min(len(a), len(b))
    lo = 0
    while lo < n:
        hi = min(lo + _CHUNK, n)
        if a[lo:hi] != b[lo:hi]:
            while a[lo] == b[lo]:
                lo += 1
            return lo
        lo = hi
    return n


def _reference(call: FullCall, shared_len: int) -> ModelCall:
    fields = {name: getattr(call, name) for name in _FIELDS}
    return ModelCall(**fields, shared_len=shared_len, prompt_tail=call.prompt_ids[shared_len:])


class ExecutionTokens:
    """One execution's token sequences, rebuilt from reference records on demand.

    Holds only the records (O(the execution's tokens)); `sequence` and `prompt_ids` build one
    call's list in O(its length + the depth of its parent chain). Calls are added in record
    order (a parent before its children): the constructor or `add`.
    Raises `KeyError` for an unknown call id and `ValueError` for a reference that names no
    earlier call or shares more tokens than its parent has.
    """

    __slots__ = ("_by_id",)

    def __init__(self, calls: Iterable[ModelCall] = ()) -> None:
        self._by_id: dict[str, ModelCall] = {}
        for call in calls:
            self.add(call)

    def add(self, call: ModelCall) -> None:
        if call.shared_len:
            parent = self._by_id.get(call.parent_call_id or "")
            if parent is None:
                raise ValueError(
                    f"call {call.call_id!r}: shared_len={call.shared_len} but its parent "
                    f"{call.parent_call_id!r} is not an earlier call"
                )
            have = parent.prompt_len + len(parent.completion_ids)
            if call.shared_len > have:
                raise ValueError(
                    f"call {call.call_id!r}: shared_len={call.shared_len} > {have} tokens of "
                    f"parent {parent.call_id!r}"
                )
        self._by_id[call.call_id] = call

    def __contains__(self, call_id: object) -> bool:
        return call_id in self._by_id

    def __getitem__(self, call_id: str) -> ModelCall:
        return self._by_id[call_id]

    def sequence(self, call_id: str, upto: int | None = None) -> list[int]:
        """The call's prompt + completion IDs (the first `upto` of them), a new list."""
        call = self._by_id[call_id]
        total = call.prompt_len + len(call.completion_ids)
        upto = total if upto is None else min(upto, total)
        pieces: list[tuple[ModelCall, int]] = []  # (call, how many of its own tokens)
        while upto > 0:
            if upto > call.shared_len:
                pieces.append((call, upto - call.shared_len))
                upto = call.shared_len
            if upto:
                call = self._by_id[call.parent_call_id]  # type: ignore[index]
        out: list[int] = []
        for c, k in reversed(pieces):
            tail = c.prompt_tail
            out += tail[:k]
            if k > len(tail):
                out += c.completion_ids[: k - len(tail)]
        return out

    def prompt_ids(self, call_id: str) -> list[int]:
        """The call's whole prompt, a new list (O(prompt))."""
        return self.sequence(call_id, self._by_id[call_id].prompt_len)

    def full_call(self, call_id: str) -> FullCall:
        """The call with its whole prompt."""
        call = self._by_id[call_id]
        fields = {name: getattr(call, name) for name in _FIELDS}
        return FullCall(**fields, prompt_ids=self.prompt_ids(call_id))

    def full_calls(self) -> list[FullCall]:
        """Every call with its whole prompt, in record order (O(calls x history): for clients
        and tests, never the hot path)."""
        return [self.full_call(call_id) for call_id in self._by_id]


def to_reference(calls: Iterable[ModelCall | FullCall]) -> list[ModelCall]:
    """Records in reference form: a `FullCall` gets `shared_len` = the longest common prefix of
    its prompt and its parent's prompt + completion; a `ModelCall` is kept as it is.

    O(the input's tokens). A parent that is not an earlier call leaves the whole prompt as the
    tail (`gyre.trajectory.build_tree` then names the error)."""
    out: list[ModelCall] = []
    sequences: dict[str, list[int]] = {}
    tokens = ExecutionTokens()
    for call in calls:
        if isinstance(call, FullCall):
            parent = call.parent_call_id
            shared = 0
            if parent is not None and parent in tokens:
                if parent not in sequences:
                    sequences[parent] = tokens.sequence(parent)
                shared = common_prefix_len(call.prompt_ids, sequences[parent])
            ref = _reference(call, shared)
            sequences[call.call_id] = call.prompt_ids + call.completion_ids
        else:
            ref = call
        if ref.call_id not in tokens:
            tokens.add(ref)
        out.append(ref)
    return out


class ExecutionSummary(msgspec.Struct, frozen=True, kw_only=True):
    """Per-execution totals, written to the call log when the execution is closed."""

    execution_id: str
    num_calls: int
    """Model-call records (one per choice)."""
    truncated: bool
    """True if any call was cut off: a choice finished with `length` or a prompt was refused for
    exceeding the context (field case B14, B15). One flag per execution."""
    length_calls: int
    """Records whose finish reason is `length`."""
    context_refusals: int
    """Requests refused because the prompt did not fit the engine's context."""
    divergences: int
    """Records whose prompt does not extend their parent's prompt + completion."""
    prompt_tokens: int
    """Sum of prompt lengths over records, tokens (a shared prefix counts every time)."""
    completion_tokens: int
    """Sum of completion lengths over records, tokens."""
    closed_s: float = 0.0
    """Unix time the execution was closed, seconds."""
