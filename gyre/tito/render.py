"""Incremental chat rendering: chat messages to exact prompt token IDs, reusing every known token.

Owns `ChatRenderer` (what it remembers per execution is `render_state`'s; what a template sees,
`template_input`'s). The rule (docs/design.md invariant 1): when a call's
messages + returned reply prefix the new messages and the template re-renders that reply as the
generated text, the prompt is `parent prompt + parent completion + tokens of the new text` (an
anchor render, checked against a full one on the first call and every `check_every`-th; disagreeing
templates render in full for good). With `history="heal"` a history that differs from the
recorded calls only by a client habit (`gyre.tito.heal`) is matched as sent and the recorded reply
put back, so it extends the parent the same way (`Rendered.heals`). Otherwise the whole
conversation is rendered, the parent's tokens kept over the longest shared text and a `Divergence`
recorded where they differ. Generated text is never re-tokenized. `count_chat` is the length of
the prompt `render_chat` would build, with no trace in the execution's state. Knows nothing
about HTTP, engines or logs.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Literal

from gyre.tito.detok import TokenText
from gyre.tito.heal import HEAL_REASONS, echo_heals, has_invalid_utf8, heal_echo
from gyre.tito.records import Divergence
from gyre.tito.render_state import Node, Rendered, RenderState, RenderStatistics
from gyre.tito.splice import splice
from gyre.tito.template_input import (
    PROBE_ARGUMENTS,
    LiteralText,
    TemplateRoles,
    message_to_template,
    placeholder,
)
from gyre.tito.wire import ChatMessage, FunctionCall, ToolCall, message_text

__all__ = ["ChatRenderer"]


_GIL_FREE_CHARS = 32 * 1024
"""Texts longer than this are tokenized with `encode_batch`, which releases the GIL (the Rust
`Tokenizer.encode` holds it: a 10 MB prompt rendered in a worker thread stalled every other
request of the node for ~30 s); shorter ones with `encode`, which costs less per call."""


def _encode(backend: Any, text: str) -> list[int]:
    """Token IDs of `text` from a `tokenizers.Tokenizer`, no special tokens added; the same IDs
    either way (`encode_batch` of one text is that text's `encode`)."""
    if len(text) > _GIL_FREE_CHARS:
        return backend.encode_batch([text], add_special_tokens=False)[0].ids
    return backend.encode(text, add_special_tokens=False).ids


def _reply_key(m: ChatMessage | None) -> tuple | None:
    """What of an assistant message a template renders: echoes that differ elsewhere still match.
    None for no message (a node without a reply matches no echo)."""
    if m is None:
        return None
    reasoning = m.reasoning_content if m.reasoning_content is not None else m.reasoning
    calls = tuple(
        (
            tc.function.name,
            tc.function.arguments
            if isinstance(tc.function.arguments, str)
            else json.dumps(tc.function.arguments),
        )
        for tc in m.tool_calls or ()
    )
    return (m.role, message_text(m.content) or "", reasoning, calls)


def _invalid_utf8(text: TokenText, node: Node) -> bool:
    """Whether `node`'s completion bytes are not UTF-8 (its text then has U+FFFD they lack)."""
    return "\ufffd" in node.completion_text and has_invalid_utf8(text.bytes_of(node.completion_ids))


class ChatRenderer:
    """Builds prompt token IDs for the chat requests of one tokenizer.

    Args:
        tokenizer: a `transformers` fast tokenizer with a chat template.
        check_every: cross-check every k-th fast-path prompt of an execution against a full
            render (the first one is always checked); 0 checks only the first.
        history: `heal` (a history that differs from the recorded calls only by client habits,
            `gyre.tito.heal`, extends the recorded tokens) or `as_sent` (every difference
            branches, with its reason).

    Raises ValueError for a negative `check_every` or an unknown `history`.
    """

    def __init__(self, tokenizer: Any, *, check_every: int = 0, history: str = "heal") -> None:
        if check_every < 0:
            raise ValueError(f"check_every={check_every} must be >= 0")
        if history not in ("heal", "as_sent"):
            raise ValueError(f"history={history!r} must be 'heal' or 'as_sent'")
        self.tokenizer = tokenizer
        self.text = TokenText(tokenizer)
        self.check_every = check_every
        self.history = history
        self.stats = RenderStatistics()
        self._backend = tokenizer.backend_tokenizer
        self._literal = LiteralText(tokenizer)
        self.faithful = self._probe_faithful()
        """Whether the tokens of a text spell that text (byte-level BPE); else the tokenizer adds
        to it (SentencePiece's `▁` before a text, after a control token), and a full render
        splices known tokens on the tokens of the whole text (`splice_tokens`)."""
        self.arguments_as = self._probearguments_for()
        """How tool-call arguments reach this template: `string` or `mapping` (decided once, by
        rendering a probe call: `message_to_template`)."""
        self.roles = TemplateRoles(tokenizer, self.arguments_as)  # messages as the template's

    # -- primitives ---------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token IDs of `text`, no special tokens added (the template already wrote them: B19).

        When `text` is (a suffix of) this thread's latest `render_text` and a message's text in
        it holds special-token text, that text is encoded as plain text (field case B26): only
        the template's own control tokens become control tokens."""
        if not text:
            return []
        spans = self._literal.spans_of(text)
        if not spans:
            return self.text.intern(_encode(self._backend, text))
        ids: list[int] = []
        pos = 0
        for a, b in spans:
            if a > pos:
                ids += _encode(self._backend, text[pos:a])
            ids += _encode(self._literal.plain, text[a:b])
            pos = b
        if pos < len(text):
            ids += _encode(self._backend, text[pos:])
        return self.text.intern(ids)

    def render_text(
        self,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The chat template's text for `messages` (`apply_chat_template(tokenize=False)`, each
        role as `self.roles` maps it).

        A message other than the assistant's whose text holds an added token's text (`<|im_end|>`,
        `<tool_call>`) is rendered once more with a placeholder in its place, which locates its
        text; `encode` then tokenizes that text as plain text (field case B26). A template that
        alters the placeholder (it is then not found exactly once per use, or the texts differ)
        gets no such spans: its text is encoded as before."""
        self._literal.forget()
        kwargs = template_kwargs or {}
        dicts = [self.roles.message(m) for m in messages]
        text = self.tokenizer.apply_chat_template(
            dicts,
            tools=tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )
        forged = self._literal.forged(messages)
        if forged:
            marked = [
                self.roles.message(m, placeholder(i)) if i in forged else d
                for i, (m, d) in enumerate(zip(messages, dicts))
            ]
            template = self.tokenizer.apply_chat_template(
                marked,
                tools=tools,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **kwargs,
            )
            self._literal.locate(text, template, forged)
        return text

    def _probe_faithful(self) -> bool:
        """Whether `TokenText.context_text(encode(t)) == t` for probe texts: plain words, a
        newline, and text around a control token."""
        added = sorted(self.tokenizer.get_added_vocab(), key=len)
        around = [f"x{added[0]} y z{added[0]}w", f"{added[-1]}q r"] if added else []
        return all(
            self.text.context_text(_encode(self._backend, t)) == t
            for t in ["a b", "a\nb  c", *around]
        )

    def _probearguments_for(self) -> str:
        """`mapping` when the template renders a string argument double-encoded (it applies
        `tojson`) or only renders a mapping; else `string`."""
        call: dict[str, Any] = {"id": "abcdefghi", "type": "function"}
        call["function"] = {"name": "gyre_probe", "arguments": PROBE_ARGUMENTS}
        conv = [
            {"role": "user", "content": "p"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
        ]
        try:
            text = self.tokenizer.apply_chat_template(conv, tokenize=False)
        except Exception:  # a template that iterates the arguments' items refuses a string
            try:
                call["function"] = {"name": "gyre_probe", "arguments": {"gyre_probe": "v"}}
                self.tokenizer.apply_chat_template(conv, tokenize=False)
            except Exception:  # it renders no tool call of this probe at all
                return "string"
            return "mapping"
        return "mapping" if json.dumps(PROBE_ARGUMENTS) in text else "string"

    def refuses_tool_id(self, tool_id: str) -> str | None:
        """The template's error for a tool call named `tool_id` and its result (Mistral's refuse
        all but 9 letters and digits), or None when it renders them."""
        call = ToolCall(id=tool_id, function=FunctionCall(name="gyre_probe", arguments="{}"))
        conv = [
            ChatMessage(role="user", content="p"),
            ChatMessage(role="assistant", content=None, tool_calls=[call]),
            ChatMessage(role="tool", content="r", tool_call_id=tool_id),
        ]
        dicts = [message_to_template(m, arguments_as=self.arguments_as) for m in conv]
        try:
            self.tokenizer.apply_chat_template(dicts, tokenize=False)
        except Exception as exc:  # jinja's own errors, raise_exception's among them
            return str(exc)
        return None

    # -- chat ---------------------------------------------------------------------------------

    def render_chat(
        self,
        state: RenderState,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: dict[str, Any] | None = None,
        parent: Node | None | Literal[True] = True,
    ) -> Rendered:
        """Prompt IDs for a chat request of the execution whose state is `state`.

        `parent`: the result of `find_parent` when the caller already has it (True: look it up);
        `continue_final_message` (the reply continues the last message) renders in full.
        Raises ValueError when the template cannot render the messages (e.g. a non-text part).
        """
        if parent is True:
            parent = self.find_parent(state, messages, tools, template_kwargs)
        if not add_generation_prompt:
            parent = None
        sent = messages
        heals: tuple[str, ...] = ()
        if parent is not None:
            messages, heals = self._link(parent, messages)
        if continue_final_message:  # `apply_chat_template`'s own keyword, passed with the kwargs
            kwargs = {**(template_kwargs or {}), "continue_final_message": True}
            return self._render_full(state, messages, tools, False, kwargs)
        rendered = self._render(
            state, messages, tools, add_generation_prompt, template_kwargs, parent
        )
        return self._finish(rendered, sent, heals, parent)

    def count_chat(
        self,
        state: RenderState,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
        parent: Node | None | Literal[True] = True,
    ) -> int:
        """The length of the prompt `render_chat` would build for these messages now: the same
        parent (`parent` as in `render_chat`), healing and path (fast, full or repeat), built
        without a trace: `state`, its nodes' token lists and the statistics stay as they were
        (Anthropic's `count_tokens`). Raises what `render_chat` raises."""
        if parent is True:
            parent = self.find_parent(state, messages, tools, template_kwargs)
        if parent is not None and add_generation_prompt:
            assert parent.messages is not None  # a chat call's (find_parent picks those only)
            messages = self._link(parent, messages)[0]
            if len(parent.messages) == len(messages):
                return parent.prompt_len
            if not self.check_due(state):  # `_render`'s unchecked fast path (a check: full)
                suffix = self._fast_suffix(parent, messages, tools, template_kwargs)
                if suffix is not None:
                    known = parent.prompt_len + len(parent.completion_ids)
                    return known + len(self.encode(suffix))
        else:
            parent = self._best_candidate(state, messages, tools)[0]
        text = self.render_text(messages, tools, add_generation_prompt, template_kwargs)
        if parent is None:
            return len(self.encode(text))
        return len(self.splice_tokens(parent.known_ids(), text)[0])

    def _render(
        self, state, messages, tools, add_generation_prompt, template_kwargs, parent
    ) -> Rendered:
        """The prompt of `messages` (healed already) extending `parent` if it can."""
        if parent is not None and len(parent.messages) == len(messages):
            # The same conversation again (a retry, or more samples): the same prompt, a sibling.
            return Rendered(
                prompt_ids=parent.prompt_ids,  # a copy: the shared list may grow while this runs
                parent=parent.parent,
                divergence=parent.divergence,
                messages=parent.messages,
                tools=parent.tools,
                path="repeat",
            )
        if parent is not None and state.anchor_ok is not False:
            fast = self._render_fast(parent, messages, tools, template_kwargs)
            if fast is not None:
                if not self.check_due(state):
                    state.fast_since_check += 1
                    self.stats.fast += 1
                    return fast
                full = self._render_full(
                    state, messages, tools, add_generation_prompt, template_kwargs, parent
                )
                self.stats.checks += 1
                state.fast_since_check = 0
                ok = full.prompt_ids == fast.prompt_ids and full.divergence is None
                if not ok:
                    self.stats.check_failures += 1
                state.anchor_ok = ok if state.anchor_ok is None else state.anchor_ok and ok
                return full
        return self._render_full(
            state, messages, tools, add_generation_prompt, template_kwargs, parent
        )

    def check_due(self, state: RenderState) -> bool:
        """Whether the next fast-path prompt of this execution is cross-checked by a full render
        (or the execution renders in full anyway): then rendering costs O(history)."""
        return state.anchor_ok is not True or bool(
            self.check_every and state.fast_since_check + 1 >= self.check_every
        )

    def find_parent(
        self,
        state: RenderState,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> Node | None:
        """The most recent choice whose messages (as sent) + reply are a prefix of `messages`, or
        whose messages are exactly `messages` (a repeated request). With `history="heal"` the
        echoed reply may differ by client habits (`gyre.tito.heal.heal_echo`), or be left out
        when its choice ends a branch no other choice shares (`reply_dropped`; taken when no
        choice matches more of `messages`). Cost: one C-level comparison of the shared
        messages."""
        n = len(messages)
        heal = self.history == "heal"
        dropped, dropped_k = None, -1
        nodes = state.nodes
        for i in range(len(nodes) - 1, -1, -1):
            node = nodes[i]
            conv = node.conversation
            if conv is None:
                continue
            k = len(conv)
            if k > n or node.tools != tools or node.template_kwargs != template_kwargs:
                continue
            healed: ChatMessage | None = None  # the reply the echo was healed against
            if k < n and _reply_key(messages[k]) != _reply_key(node.reply):
                echo = messages[k]
                if not heal or node.reply is None:
                    continue
                if echo.role != "assistant":
                    if k > dropped_k and messages[:k] == conv and self._abandoned(state, i):
                        dropped, dropped_k = node, k
                    continue
                if not heal_echo(echo, node.reply)[1]:
                    continue
                healed = node.reply
            if messages[:k] == conv:
                if healed is not None and self._heal_echo(messages[k], healed) is None:
                    continue
                return node if k == n or k + 1 > dropped_k else dropped
        return dropped

    @staticmethod
    def _abandoned(state: RenderState, i: int) -> bool:
        """Whether choice `i` ends a branch: no later choice extends it, and no other choice
        answered the same request (n > 1, a repeat), so its reply is the one left out."""
        node = state.nodes[i]
        if any(other.parent is node for other in state.nodes[i + 1 :]):
            return False
        return not any(o is not node and o.messages is node.messages for o in state.nodes)

    def _heal_echo(self, echo: ChatMessage, reply: ChatMessage) -> tuple[str, ...] | None:
        """`gyre.tito.heal.echo_heals` with this template (its arguments' form)."""

        def render(m: ChatMessage) -> str:
            d = message_to_template(m, arguments_as=self.arguments_as)
            user = {"role": "user", "content": "x"}
            return self.tokenizer.apply_chat_template([user, d], tokenize=False)

        return echo_heals(echo, reply, message_to_template, render)

    def _link(
        self, parent: Node, messages: list[ChatMessage]
    ) -> tuple[list[ChatMessage], tuple[str, ...]]:
        """`messages` in `parent.messages`' terms (the conversation its tokens render, then the
        new messages), and the client habits healed on the way (`find_parent` chose `parent`):
        an echoed reply healed or a dropped one is `parent.reply` again."""
        conv, shared, reply = parent.conversation, parent.messages, parent.reply
        assert conv is not None and shared is not None  # find_parent picks chat calls only
        k = len(conv)
        if k == len(messages):
            return shared, ()
        echo = messages[k]
        if self.history == "heal" and reply is not None and _reply_key(echo) != _reply_key(reply):
            if echo.role != "assistant":
                return shared + [reply] + messages[k:], ("reply_dropped",)
            reasons = self._heal_echo(echo, reply)
            if reasons:
                return shared + [reply] + messages[k + 1 :], reasons
        return shared + messages[k:], ()

    def _finish(
        self, r: Rendered, sent: list[ChatMessage], heals: tuple[str, ...], parent: Node | None
    ) -> Rendered:
        """`r` with its heals (kept, and counted, when the prompt extends the parent's tokens)
        and the client's messages where they differ from `r.messages`."""
        if parent is None:
            return r
        if r.path == "repeat":
            heals, keep = parent.heals, parent.sent
        else:
            keep = sent if heals or parent.sent is not None else None
            if r.divergence is not None:
                heals = ()
            elif self.history == "heal" and _invalid_utf8(self.text, parent):
                heals = (*heals, "invalid_utf8")
        if heals:
            heals = tuple(h for h in HEAL_REASONS if h in heals)
            self.stats.heals += 1
            for h in heals:
                self.stats.heal_reasons[h] = self.stats.heal_reasons.get(h, 0) + 1
        if not heals and keep is None:
            return r
        return replace(r, sent=keep, heals=heals)

    def _fast_suffix(self, parent: Node, messages, tools, template_kwargs) -> str | None:
        """The text after the parent's prompt + completion, from a render of only [head (the
        first message: templates render it specially), echoed reply, new messages]; None when
        the reply does not re-render to exactly the parent's completion text, or when that text
        has U+FFFD for invalid bytes and `history="as_sent"` (the echo's U+FFFD is then not what
        was sampled: a branch)."""
        if self.history != "heal" and _invalid_utf8(self.text, parent):
            return None
        assert parent.messages is not None  # a chat call's (find_parent picks those only)
        head = messages[:1]
        if parent.head_text is None:  # a cache of the template's render of `head`
            parent.head_text = self.render_text(head, tools, True, template_kwargs)
        a = parent.head_text
        b = self.render_text(head + messages[len(parent.messages) :], tools, True, template_kwargs)
        ct = parent.completion_text
        if not (b.startswith(a) and b.startswith(ct, len(a))):
            return None
        return b[len(a) + len(ct) :]

    def _render_fast(self, parent: Node, messages, tools, template_kwargs) -> Rendered | None:
        """The parent's prompt + completion + the tokens of `_fast_suffix` (None without one)."""
        suffix = self._fast_suffix(parent, messages, tools, template_kwargs)
        if suffix is None:
            return None
        assert parent.messages is not None
        ids = parent.extend_ids()  # no copy of the history while the conversation is linear
        ids += self.encode(suffix)
        shared = parent.messages + messages[len(parent.messages) :]
        return Rendered(
            prompt_ids=ids,
            parent=parent,
            divergence=None,
            messages=shared,
            tools=parent.tools,
            path="fast",
        )

    def _best_candidate(
        self,
        state: RenderState,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]] | None,
        limit: int = 256,
    ) -> tuple[Node | None, int]:
        """The recent chat choice sharing the most leading messages with `messages` (reply
        compared by what renders), and that count; one with the same `tools` goes first, and
        ties go to the most recent.

        Templates render the tools early (Qwen and Hermes: in the system turn), so a choice with
        other tools shares only the tokens before them. An agent's compaction asks for its
        summary without tools, then restarts with them: the restart shares the system turn, the
        tools and the task with the calls before the summary, but only the system text with the
        summary call (52 tokens instead of 806-827 in `learnable-long`)."""
        best, best_key = None, (False, 0)
        for node in reversed(state.nodes[-limit:]):
            conv = node.conversation
            if conv is None:
                continue
            m = 0
            n = min(len(conv), len(messages))
            while m < n and conv[m] == messages[m]:
                m += 1
            if (
                m == len(conv)
                and m < len(messages)
                and _reply_key(messages[m]) == _reply_key(node.reply)
            ):
                m += 1
            key = (node.tools == tools, m)
            if m > 0 and key > best_key:
                best, best_key = node, key
        return best, best_key[1]

    def _render_full(
        self,
        state,
        messages,
        tools,
        add_generation_prompt,
        template_kwargs,
        parent: Node | None = None,
    ) -> Rendered:
        """Render the whole conversation; keep the exact tokens of `parent` (the call whose
        messages + reply the request extends) or else of the recent call sharing the most
        leading messages, over the longest shared text; flag a divergence where they differ."""
        self.stats.full += 1
        text = self.render_text(messages, tools, add_generation_prompt, template_kwargs)
        conv: list[ChatMessage] | None
        if parent is not None:
            assert parent.messages is not None  # a chat call's (find_parent picks those only)
            conv, matched = parent.messages, len(parent.messages) + 1
        else:
            parent, matched = self._best_candidate(state, messages, tools)
            conv = None if parent is None else parent.conversation
        if parent is None:
            return Rendered(
                prompt_ids=self.encode(text),
                parent=None,
                divergence=None,
                messages=list(messages),
                tools=tools,
            )
        assert conv is not None  # _best_candidate picks chat calls only
        ids, index = self._splice(parent, text)
        divergence = None
        if index is not None:
            self.stats.divergences += 1
            reason = self._reason(parent, conv, messages, matched, tools)
            divergence = Divergence(parent_call_id=parent.call_id, index=index, reason=reason)
        shared = (
            conv[:matched] + messages[matched:]
            if matched <= len(conv)
            else conv + messages[len(conv) :]
        )
        return Rendered(
            prompt_ids=ids, parent=parent, divergence=divergence, messages=shared, tools=tools
        )

    def _splice(self, parent: Node, text: str) -> tuple[list[int], int | None]:
        """Prompt IDs for `text` keeping the parent's exact tokens over the longest shared text
        prefix; returns (ids, first index differing from parent prompt + completion, or None)."""
        return self.splice_tokens(parent.known_ids(), text)

    def splice_tokens(self, known: list[int], text: str) -> tuple[list[int], int | None]:
        """(ids, divergence index or None): `known` tokens kept while their bytes prefix `text`
        (`gyre.tito.splice.splice`); with `history="heal"` an invalid UTF-8 sequence of `known`
        also matches the U+FFFD that `bytes.decode(errors="replace")` gives for it. A tokenizer
        that is not `faithful` is compared on the tokens of the whole `text`."""
        heal = self.history == "heal"
        return splice(self.text, self.encode, known, text, heal=heal, faithful=self.faithful)

    def _reason(self, parent: Node, conv, messages, matched: int, tools) -> str:
        """Why `messages` (sharing `matched` leading messages with `conv`, the messages `parent`
        answered, counting its reply as one) branch off `parent`'s tokens."""
        k = len(conv)
        if tools != parent.tools:
            return "tools_changed"
        if matched < k:
            return "compaction" if len(messages) <= k else "message_edited"
        if matched == k:
            echo, reply = messages[k] if k < len(messages) else None, parent.reply
            if echo is None or echo.role != "assistant":
                return "history_rewritten"
            reasons = None if reply is None else self._heal_echo(echo, reply)
            return reasons[0] if reasons else "message_edited"
        if parent.stop_string:
            return "stop_string_trimmed"
        reply = parent.reply
        if self.history != "heal" and _invalid_utf8(self.text, parent):
            return "invalid_utf8"
        if reply is not None and reply.reasoning_content is not None:
            return "template_dropped_reasoning"
        return "template_rerendered"
