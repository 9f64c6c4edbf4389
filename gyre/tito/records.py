"""Model-call records: the exact tokens of every call an agent made, as the TITO proxy saw them.

Owns `Role`, `Divergence`, `ModelCall` (one record per choice of one model call) and
`ExecutionSummary` (what the proxy knows about a whole execution when it is closed). The trajectory
tree is built from these records only; the append-only log that stores them lives beside them.
Records know nothing about HTTP, chat messages or trees.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from gyre.engines.protocol import FinishReason, SamplingParams

__all__ = ["Role", "ROLES", "Divergence", "ModelCall", "ExecutionSummary"]

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


class ModelCall(msgspec.Struct, frozen=True, kw_only=True):
    """One choice of one model call, exactly as sampled (TITO: never re-tokenized).

    `completion_ids`, `logprobs` and `versions` have equal length; logprobs are behaviour
    logprobs in nats of the distribution sampled from; `versions` the weight version per token.
    """

    execution_id: str
    call_id: str
    """Unique within the execution; `<call>` or `<call>/<choice>` for n > 1."""
    role: Role
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: FinishReason
    parent_call_id: str | None = None
    """The call whose prompt + completion this prompt extends (None for the first call)."""
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
