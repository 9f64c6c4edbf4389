"""Model-call records: the exact tokens of every call an agent made, as the TITO proxy saw them.

Owns `Role`, `Divergence` and `ModelCall` (one record per choice of one model call). The trajectory
tree is built from these records only; the append-only log that stores them lives beside them.
Records know nothing about HTTP, chat messages or trees.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from gyre.engines.protocol import FinishReason, SamplingParams

__all__ = ["Role", "ROLES", "Divergence", "ModelCall"]

Role = Literal["main", "main_summary", "sub_agent", "sub_agent_summary"]
ROLES: tuple[Role, ...] = ("main", "main_summary", "sub_agent", "sub_agent_summary")
"""Roles in priority order for Jmax selection (DESIGN.md: main > main summary > sub-agent > ...)."""


class Divergence(msgspec.Struct, frozen=True, kw_only=True):
    """Why a call's prompt is not `parent prompt + parent completion + new tokens`."""

    parent_call_id: str
    """The earlier call the prompt was compared with."""
    index: int
    """First token index where the prompt differs from the parent's prompt + completion."""
    reason: str
    """What the agent changed: `history_rewritten`, `template_dropped_reasoning`,
    `tool_arguments_reserialized`, `message_edited`, `compaction`, ..."""


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
