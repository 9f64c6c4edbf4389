"""Recording: a finished (or broken-off) model call becomes `ModelCall` records in the call log.

Owns `Recorder`: every choice of a call becomes one `ModelCall` (the exact prompt IDs the engine
ran on, as the parent's shared tokens plus its own new ones, so recording costs O(new tokens); the
completion IDs, behaviour logprobs and weight versions it sampled, finish reason, parent and
divergence), appended to the `CallLog` first and then to the execution's records, with
the renderer `Node` that later calls extend. A call is written at most once; a call that did not
complete keeps what was sampled (`record_partial`, finish `abort`) for its lifecycle to record,
hold for a retry or drop (`gyre.tito.inflight.InFlight`); once an execution is sealed (its end),
a record of it is dropped, so none follows its end entry (B29). Knows nothing about HTTP or
OpenAI's format.
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
from gyre.tito.sessions import Execution
from gyre.tito.wire import ChatMessage

__all__ = ["Recorder"]


class Recorder:
    """Records the calls of one proxy.

    Args:
        log: the append-only call log; None keeps records in memory only (tests).
        text: the tokenizer's `TokenText` (a node keeps its completion's text).
    """

    def __init__(self, log: CallLog | None, text: TokenText) -> None:
        self.log = log
        self.text = text
        self._writing: dict[str, int] = {}
        """Execution -> records of it being written now (`seal` waits for them)."""
        self._written: dict[str, anyio.Event] = {}
        self.calls_recorded = 0
        """ModelCall records written (one per choice)."""
        self.completion_tokens = 0
        """Completion tokens recorded."""
        self.records_dropped_closed = 0
        """Records not written because their execution had been closed (its end entry written)."""

    async def record(self, call: Call, replies: Sequence[ChatMessage | None]) -> list[ModelCall]:
        """A call that ended: written (`write`) when every choice finished; a choice unfinished
        means it was cut short (its engine stream closed under a cancel), and what was sampled is
        kept as its partial records for `InFlight.leave` to decide, as `record_partial` does."""
        if any(ch.finish is None for ch in call.choices):
            if not call.recorded and call.partial is None and any(ch.ids for ch in call.choices):
                call.partial = list(replies)
            return []
        return await self.write(call, replies)

    async def write(self, call: Call, replies: Sequence[ChatMessage | None]) -> list[ModelCall]:
        """Write every choice (log first, then memory) unless the call was written or dropped
        before, or its execution is sealed: the response may complete after this.

        Shielded from cancellation: a call is marked recorded when this starts, so a cancel at
        its first log append would lose it (B29: an execution closed while its stream ends)."""
        if call.recorded:
            return []
        call.recorded = True
        eid = call.execution.execution_id
        if call.execution.closed:
            self.records_dropped_closed += len(call.choices)
            return []
        self._writing[eid] = self._writing.get(eid, 0) + 1
        recorded: list[ModelCall] = []
        try:
            with anyio.CancelScope(shield=True):
                recorded = await self._record(call, replies)
        finally:
            self._writing[eid] -= 1
            if not self._writing[eid]:
                del self._writing[eid]
                if (written := self._written.pop(eid, None)) is not None:
                    written.set()
        return recorded

    async def seal(self, execution: Execution) -> None:
        """Close `execution` once the records of it being written are written: its records are
        final (the same as the log holds for it), and any later record of it is dropped."""
        while execution.execution_id in self._writing:
            await self._written.setdefault(execution.execution_id, anyio.Event()).wait()
        execution.closed = True  # no checkpoint since the loop's last check

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
        """A response that did not complete (client gone, engine error, execution ended): abort the
        engine request and keep what was sampled as the call's partial records (`Call.partial`),
        which `InFlight.leave` records, holds for a retry or drops. A request that produced no
        token keeps nothing. `reply` makes a chat choice's assistant message (None: a
        completions call)."""
        if call.recorded or call.partial is not None or not any(ch.ids for ch in call.choices):
            return
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(EngineError):
                await call.engine.abort(call.request_id)
            call.partial = [None if reply is None else reply(call, ch) for ch in call.choices]
