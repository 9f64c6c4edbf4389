"""What the chat renderer remembers per execution, and what one render returns.

Owns `Node` (one recorded choice: its prompt as a view of a shared token list, completion, the
messages and reply it came from), `RenderState` (an execution's nodes), `Rendered` (a prompt ready
for the engine, with its parent, divergence and heals), `RenderStatistics` and `link_tokens` (a
completions prompt of token IDs linked to the nodes, no template involved). Memory stays
O(history) per execution (`Node`). Knows nothing about templates or tokenizers.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from gyre.tito.records import Divergence, common_prefix_len
from gyre.tito.wire import ChatMessage

__all__ = ["Node", "RenderState", "Rendered", "RenderStatistics", "link_tokens"]

_EXTEND_LOCK = threading.Lock()


@dataclass(slots=True, eq=False)
class Node:
    """One recorded choice, as the renderer needs it to extend later calls.

    Memory stays O(history) per execution, not O(history x calls): the prompt is the first
    `prompt_len` IDs of `prompt_ref`, a list that descendants extend in place (`extend_ids`) or,
    for a branch, a copy that this node then points at (`lend_prefix`). A linear conversation
    holds one list, appended to call after call; nothing but `prompt_len` views reads it.
    """

    call_id: str
    prompt_ref: list[int]
    """A list whose first `prompt_len` IDs are this prompt (this node's own, or a descendant's)."""
    completion_ids: list[int]
    completion_text: str
    """The completion's text inside a prompt, special tokens included (`TokenText.context_text`:
    the text the template must reproduce)."""
    messages: list[ChatMessage] | None = None
    """The request's messages (chat calls); shared with the parent's list objects where equal."""
    reply: ChatMessage | None = None
    """The assistant message the proxy returned for this choice."""
    tools: list[dict[str, Any]] | None = None
    template_kwargs: dict[str, Any] | None = None
    stop_string: bool = False
    """The completion was cut at a stop string (its text is not what the reply re-renders to)."""
    head_text: str | None = None
    """Cache: the template's render of the first message with the generation prompt."""
    parent: Node | None = None
    """The node this one's prompt extends (or diverges from)."""
    divergence: Divergence | None = None
    prompt_len: int = -1
    """Prompt length, tokens (-1 at construction: all of `prompt_ref`)."""
    sent: list[ChatMessage] | None = None
    """The request's messages as the client sent them, when healing made `messages` differ (a
    reply taken back or put back); None: `messages`. Later requests are matched against it."""
    heals: tuple[str, ...] = ()
    """Why this prompt extends its parent although the client's history differs (`HEAL_REASONS`)."""

    @property
    def conversation(self) -> list[ChatMessage] | None:
        """The messages as the client sent them (what a later request repeats)."""
        return self.messages if self.sent is None else self.sent

    def __post_init__(self) -> None:
        if self.prompt_len < 0:
            self.prompt_len = len(self.prompt_ref)

    @property
    def prompt_ids(self) -> list[int]:
        """A copy of the prompt (O(prompt); the proxy itself works on `prompt_ref` views)."""
        return self.prompt_ref[: self.prompt_len]

    def known_ids(self) -> list[int]:
        """A new list: prompt + completion (one copy)."""
        out = self.prompt_ref[: self.prompt_len]
        out += self.completion_ids
        return out

    def extend_ids(self) -> list[int]:
        """prompt + completion as a list the caller may append to: `prompt_ref` itself, extended
        in place, when nothing has extended it yet (the linear case: no copy, no new large list
        for the garbage collector to scan); otherwise a copy (a branch)."""
        with _EXTEND_LOCK:  # renders run on the loop and in worker threads: one extender per list
            ref = self.prompt_ref
            if len(ref) != self.prompt_len:
                return self.known_ids()
            ref += self.completion_ids
            return ref

    def lend_prefix(self, ids: list[int]) -> None:
        """`ids` starts with this node's prompt + completion: keep it instead of this prompt, and
        so do the ancestors that kept this node's list (it is a prefix of `ids` too)."""
        n = self.prompt_len
        assert ids[n : n + len(self.completion_ids)] == self.completion_ids, (
            "lend_prefix: not an extension"
        )
        old = self.prompt_ref
        node: Node | None = self
        if ids is old:  # extended in place: every view of it already sees the new prompt
            return
        while node is not None and node.prompt_ref is old:
            node.prompt_ref = ids
            node = node.parent


@dataclass(slots=True)
class RenderStatistics:
    """Counters of one renderer (docs/style.md rule 6); all are counts of calls."""

    fast: int = 0
    """Prompts built from the parent's tokens plus the anchor-rendered new messages."""
    full: int = 0
    """Prompts rendered from the whole conversation."""
    checks: int = 0
    """Fast-path prompts cross-checked against a full render."""
    check_failures: int = 0
    """Cross-checks that disagreed (the execution then renders in full)."""
    divergences: int = 0
    """Prompts that do not extend their parent's prompt + completion."""
    heals: int = 0
    """Prompts that extend their parent's prompt + completion only because a client habit was
    healed (`gyre.tito.heal`)."""
    heal_reasons: dict[str, int] = field(default_factory=dict)
    """Those prompts by reason (`HEAL_REASONS`; a prompt healed for two reasons counts in both)."""


@dataclass(slots=True)
class RenderState:
    """What one execution's renderer remembers: its recorded choices, oldest first."""

    nodes: list[Node] = field(default_factory=list)
    anchor_ok: bool | None = None
    """None until the anchor render is checked against a full render; False: render in full."""
    fast_since_check: int = 0


@dataclass(frozen=True, slots=True)
class Rendered:
    """A prompt ready for the engine, with where it came from."""

    prompt_ids: list[int]
    parent: Node | None
    divergence: Divergence | None
    messages: list[ChatMessage] | None = None
    """The messages to store on the new node (prefix objects shared with the parent)."""
    tools: list[dict[str, Any]] | None = None
    path: str = "full"
    """`fast` (spliced, anchor render), `full` (whole conversation), `repeat` (the same messages
    as an earlier call: its prompt), or `tokens` (completions API)."""
    sent: list[ChatMessage] | None = None
    """The request's messages as sent, when they differ from `messages` (`Node.sent`)."""
    heals: tuple[str, ...] = ()
    """The client habits healed to extend the parent (`HEAL_REASONS` order; `Node.heals`)."""


def link_tokens(
    state: RenderState, prompt_ids: list[int], stats: RenderStatistics, limit: int = 64
) -> Rendered:
    """Parent and divergence of a raw token prompt (completions API) among the execution's last
    `limit` nodes; the IDs are kept as sent (a divergence is counted in `stats`)."""
    best, best_len = None, 0
    for node in reversed(state.nodes[-limit:]):
        n = node.prompt_len
        if (
            n == len(prompt_ids) and node.prompt_ref[:n] == prompt_ids
        ):  # the same prompt again: a sibling
            return Rendered(
                prompt_ids=prompt_ids,
                parent=node.parent,
                divergence=node.divergence,
                path="repeat",
            )
        known = node.known_ids()
        if len(known) <= len(prompt_ids) and prompt_ids[: len(known)] == known:
            return Rendered(prompt_ids=prompt_ids, parent=node, divergence=None, path="tokens")
        m = common_prefix_len(known, prompt_ids)
        if m > best_len:
            best, best_len = node, m
    if best is None:
        return Rendered(prompt_ids=prompt_ids, parent=None, divergence=None, path="tokens")
    stats.divergences += 1
    div = Divergence(parent_call_id=best.call_id, index=best_len, reason="prompt_tokens_changed")
    return Rendered(prompt_ids=prompt_ids, parent=best, divergence=div, path="tokens")
