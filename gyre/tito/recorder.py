"""Recording: a finished (or broken-off) model call becomes `ModelCall` records in the call log.

Owns `Recorder`: every choice of a call becomes one `ModelCall` (the exact prompt IDs the engine
ran on, as the parent's shared tokens plus its own new ones, so recording costs O(new tokens); the
completion IDs, behaviour logprobs and weight versions it sampled, finish reason, parent and
divergence), appended to the `CallLog` first and then to the execution's records, with
the renderer `Node` that later calls extend. A call that did not complete is recorded with what was
sampled (finish `abort`); one whose clients all left is held for `retry_window_s` first, and
dropped if the client sends the same request again (`settle`: one logical call); a call that ends
after its execution was closed is dropped, so no record follows the execution's end entry (B29).
Knows nothing about HTTP or OpenAI's format.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence

import anyio

from gyre.engines.protocol import FinishReason
from gyre.errors import EngineError
from gyre.tito.detok import TokenText
from gyre.tito.generation import Call, Choice
from gyre.tito.log import CallLog
from gyre.tito.records import ModelCall
from gyre.tito.render_state import Node
from gyre.tito.wire import ChatMessage

__all__ = ["Recorder"]


class Recorder:
    """Records the calls of one proxy.

    Args:
        log: the append-only call log; None keeps records in memory only (tests).
        text: the tokenizer's `TokenText` (a node keeps its completion's text).
    """

    def __init__(
        self, log: CallLog | None, text: TokenText, *, retry_window_s: float = 0.0
    ) -> None:
        self.log = log
        self.text = text
        self.retry_window_s = retry_window_s
        """How long the partial records of a call its client left wait for a retry of the same
        request (`record_partial`); 0 records them at once."""
        self._held: dict[str, list[tuple[float, Call, list[ChatMessage | None]]]] = {}
        """Execution -> (deadline, call, replies) of the held partial calls, oldest first."""
        self.retries_superseded = 0
        """Held partial calls dropped because their client sent the same request again."""
        self.calls_recorded = 0
        """ModelCall records written (one per choice)."""
        self.completion_tokens = 0
        """Completion tokens recorded."""
        self.records_dropped_closed = 0
        """Records not written because their execution had been closed (its end entry written)."""

    async def record(self, call: Call, replies: Sequence[ChatMessage | None]) -> list[ModelCall]:
        """Record every choice (log first, then memory): the response may complete after this.

        Shielded from cancellation: a call is marked recorded when this starts, so a cancel at
        its first log append would lose it (B29: an execution closed while its stream ends)."""
        if call.recorded:
            return []
        call.recorded = True
        if call.execution.closed:
            self.records_dropped_closed += len(call.choices)
            return []
        with anyio.CancelScope(shield=True):
            recorded = await self._record(call, replies)
        return recorded

    async def _record(self, call: Call, replies: Sequence[ChatMessage | None]) -> list[ModelCall]:
        ex, rendered = call.execution, call.rendered
        parent = rendered.parent
        prompt = rendered.prompt_ids
        shared = 0
        if parent is not None:
            if rendered.divergence is None:
                shared = parent.prompt_len + len(parent.completion_ids)
            else:
                shared = rendered.divergence.index  # the longest prefix shared with the parent
        tail = prompt[shared:]  # O(new tokens); one list for every choice of the call
        now = time.time()
        out = []
        if parent is not None and rendered.divergence is None and rendered.path != "repeat":
            parent.lend_prefix(prompt)  # the parent's prompt now lives in this list
        for ch, reply in zip(call.choices, replies):
            finish: FinishReason = ch.finish or "abort"
            mc = ModelCall(
                execution_id=ex.execution_id,
                call_id=call.choice_call_id(ch.index),
                role=call.role,
                shared_len=shared,
                prompt_tail=tail,
                completion_ids=ch.ids,
                logprobs=ch.lps,
                versions=ch.vers,
                finish_reason=finish,
                parent_call_id=None if parent is None else parent.call_id,
                choice_index=ch.index,
                sampling=call.sampling,
                started_s=call.started_s,
                finished_s=now,
                divergence=rendered.divergence,
                heals=rendered.heals,
            )
            if self.log is not None:
                await self.log.append_call(mc)
            node = Node(
                call_id=mc.call_id,
                prompt_ref=prompt,
                completion_ids=ch.ids,
                completion_text=self.text.context_text(ch.ids),
                messages=rendered.messages,
                reply=reply,
                tools=rendered.tools,
                template_kwargs=call.template_kwargs,
                stop_string=ch.stop_string,
                parent=parent,
                divergence=rendered.divergence,
                sent=rendered.sent,
                heals=rendered.heals,
            )
            ex.render.nodes.append(node)
            ex.add(mc)
            self.calls_recorded += 1
            self.completion_tokens += len(ch.ids)
            out.append(mc)
        return out

    async def record_partial(
        self, call: Call, reply: Callable[[Call, Choice], ChatMessage] | None
    ) -> None:
        """A response that did not complete (client gone, engine error): abort, keep the tokens.
        A request that produced no token records nothing. `reply` makes a chat choice's assistant
        message (None: a completions call)."""
        if call.recorded or call.held or not any(ch.ids for ch in call.choices):
            return
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(EngineError):
                await call.engine.abort(call.request_id)
            replies = [None if reply is None else reply(call, ch) for ch in call.choices]
            if call.disconnected and call.request_key is not None and self.retry_window_s > 0:
                # Its client left mid-call: a retry of the same request within the window is the
                # same logical call, and this partial sample is dropped for it (`settle`).
                call.held = True
                deadline = anyio.current_time() + self.retry_window_s
                self._held.setdefault(call.execution.execution_id, []).append(
                    (deadline, call, replies)
                )
                return
            await self.record(call, replies)

    async def settle(self, execution_id: str, request_key: bytes | None = None) -> None:
        """Before a request of `execution_id` starts (and when it closes: `request_key` None):
        the held partial calls of the same request are dropped (the client retried: one logical
        call, counted in `retries_superseded`), the others are recorded now, in order."""
        held = self._held.pop(execution_id, None)
        if not held:
            return
        with anyio.CancelScope(shield=True):
            for _, call, replies in held:
                if request_key is not None and call.request_key == request_key:
                    call.recorded = True
                    self.retries_superseded += 1
                else:
                    await self.record(call, replies)

    async def record_expired(self) -> None:
        """Record every held partial call whose retry window has passed (oldest first)."""
        now = anyio.current_time()
        with anyio.CancelScope(shield=True):
            for execution_id in list(self._held):
                held = self._held[execution_id]
                while held and held[0][0] <= now:
                    _, call, replies = held.pop(0)
                    await self.record(call, replies)
                if not held:
                    self._held.pop(execution_id, None)

    async def run_expiry(self, interval_s: float = 1.0) -> None:
        """Record expired held calls every `interval_s` until cancelled; then record the rest."""
        try:
            while True:
                await anyio.sleep(interval_s)
                await self.record_expired()
        finally:
            with anyio.CancelScope(shield=True):
                for execution_id in list(self._held):
                    await self.settle(execution_id)
