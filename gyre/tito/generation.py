"""Generation: driving the inference engine for one model call, choice by choice.

Owns `Call` (one request in flight: its execution, engine, rendered prompt, sampling and stop
strings) and `Choice` (one sample: token IDs, behaviour logprobs, weight versions, visible text,
finish), `engine_events`, which runs the engine in a producer task and turns each delta into
text for a consumer that yields elsewhere between deltas (a streamed reply), and `run_to_end`,
which does the same in the caller's own task for a non-streamed call (one task wake-up a delta,
not two: the node's CPU a batch of 32 x 64-token completions through the proxy, 0.11 -> 0.098 s).
Stop strings: generation stops once the decoded text contains one; the visible text ends before
it, while every token sampled up to and including the one that completed it is kept (they were
sampled and carry logprobs). Knows nothing about HTTP, OpenAI's response format or the log.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio

from gyre._mailbox import Mailbox
from gyre.engines.protocol import (
    FinishReason,
    GenerateRequest,
    InferenceEngine,
    SamplingParams,
    TokenDelta,
)
from gyre.errors import EngineError
from gyre.tito.detok import TokenStream, TokenText
from gyre.tito.model_format import TextStream
from gyre.tito.records import Role
from gyre.tito.render_state import Rendered
from gyre.tito.sessions import Execution
from gyre.tito.wire import ChatMessage

__all__ = ["Choice", "Call", "engine_events", "run_to_end"]


@dataclass(slots=True)
class Choice:
    """One choice being generated."""

    index: int
    decoder: TokenStream
    ids: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    vers: list[int] = field(default_factory=list)
    top_ids: list[list[int]] = field(default_factory=list)
    """Per token, the engine's top-k token IDs (empty unless `SamplingParams.top_logprobs`)."""
    top_lps: list[list[float]] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)
    """Visible text in pieces (joined once, by `text`): stop tokens excluded, cut before a stop
    string."""
    tail: str = ""
    """The last characters of the visible text (where a stop string may be starting)."""
    new_text: str = ""
    """Visible text added by the latest engine delta (for streaming)."""
    finish: FinishReason | None = None
    stop_string: bool = False
    pending: str = ""
    """Streaming: text held back because it may be the start of a stop string."""
    stream: TextStream | None = None
    emitted_reasoning: int = 0
    emitted_content: int = 0

    @property
    def text(self) -> str:
        if len(self.parts) > 1:
            self.parts[:] = ["".join(self.parts)]
        return self.parts[0] if self.parts else ""

    def cut_tail(self, n: int) -> None:
        """Drop the last `n` visible characters (a stop string that began in earlier pieces)."""
        while n > 0 and self.parts:
            last = self.parts.pop()
            if len(last) > n:
                self.parts.append(last[: len(last) - n])
                return
            n -= len(last)

    def release_text(self, stops: tuple[str, ...]) -> str:
        """Streaming: the visible text now safe to send (what was held back + the latest delta's
        text), less a tail that may be the start of a stop string, which stays held."""
        pending = self.pending + self.new_text
        held = max((_hold_len(pending, s) for s in stops), default=0)
        self.pending = pending[len(pending) - held :]
        return pending[: len(pending) - held]


@dataclass(slots=True)
class Call:
    """One request in flight."""

    execution: Execution
    engine: InferenceEngine
    role: Role
    call_id: str
    started_s: float
    rendered: Rendered
    sampling: SamplingParams
    stops: tuple[str, ...]
    parse_tools: bool
    template_kwargs: dict[str, Any] | None
    choices: list[Choice]
    reply_parser: Any = None
    """The proxy's `model_format.ReplyParser` (None: gyre's own format)."""
    tool_ids: Any = None
    """The format's `model_format.ToolCallIds` (None: OpenAI-style `call_...` IDs)."""
    chat: bool = True
    recorded: bool = False
    """Its records were written, or it was dropped: it is never recorded (again)."""
    partial: list[ChatMessage | None] | None = None
    """Cut short: the reply of each choice to record with what was sampled (finish `abort`),
    kept by `Recorder.record_partial` for `InFlight.leave` to decide."""
    created: int = 0
    producer: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    """Cancel scope around the iteration of the engine (`engine_events` cancels it to stop
    generating once every choice is cut at a stop string)."""

    @property
    def request_id(self) -> str:
        return f"{self.execution.execution_id}/{self.call_id}"

    def request(self) -> GenerateRequest:
        """The engine request of this call: its rendered prompt IDs and sampling."""
        return GenerateRequest(
            request_id=self.request_id, prompt_ids=self.rendered.prompt_ids, sampling=self.sampling
        )

    @classmethod
    def start(
        cls,
        execution: Execution,
        engine: InferenceEngine,
        role: Role,
        started_s: float,
        rendered: Rendered,
        sampling: SamplingParams,
        stops: tuple[str, ...],
        *,
        text: TokenText,
        **kind: Any,
    ) -> Call:
        """A new call of `execution` (its next call ID), one `Choice` per sample, each decoding
        its tokens with a stream of `text`; `kind` sets `parse_tools`, `chat`, `template_kwargs`,
        `reply_parser` and `tool_ids`."""
        choices = [Choice(index=i, decoder=text.stream()) for i in range(sampling.n)]
        return cls(
            execution=execution,
            engine=engine,
            role=role,
            call_id=execution.new_call_id(),
            started_s=started_s,
            rendered=rendered,
            sampling=sampling,
            stops=stops,
            choices=choices,
            created=int(started_s),
            **kind,
        )

    def choice_call_id(self, index: int) -> str:
        """The call ID of choice `index`: the call's own, or `<call_id>/<index>` when n > 1."""
        return self.call_id if self.sampling.n == 1 else f"{self.call_id}/{index}"


@contextlib.asynccontextmanager
async def engine_events(
    call: Call, text: TokenText
) -> AsyncIterator[AsyncIterator[tuple[Choice, int]]]:
    """Run the engine for `call` in a producer task; yields the events iterator (see `_events`;
    `text` decodes the tokens). Leaving the block stops the engine (the producer is cancelled and
    the request aborted)."""
    deltas: Mailbox[TokenDelta | EngineError] = Mailbox()  # producer -> consumer, all per wake-up
    error: Exception | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(_produce, call, deltas)
        try:
            yield _events(call, deltas, text)
        except Exception as exc:  # re-raised below as itself, not inside an ExceptionGroup
            error = exc
        finally:
            if not call.producer.cancel_called and any(ch.finish is None for ch in call.choices):
                call.producer.cancel()
                with anyio.CancelScope(shield=True), contextlib.suppress(EngineError):
                    await call.engine.abort(call.request_id)
    if error is not None:
        raise error


async def _produce(call: Call, deltas: Mailbox[TokenDelta | EngineError]) -> None:
    """Iterate the engine's generator in this one task (engines may hold cancel scopes across
    their yields) and pass each delta on; an engine error is passed on as an item."""
    request = call.request()
    try:
        with call.producer:
            try:
                async with contextlib.aclosing(call.engine.generate(request)) as stream:
                    async for delta in stream:
                        deltas.put(delta)
            except EngineError as exc:
                deltas.put(exc)
    finally:
        deltas.close()


async def _events(
    call: Call, deltas: Mailbox[TokenDelta | EngineError], table: TokenText
) -> AsyncIterator[tuple[Choice, int]]:
    """After each engine delta yield (choice, index of its first new token); a choice's
    finish is set on the yield that ends it. Raises the engine's error."""
    apply = _DeltaText(call, table)
    while True:
        await deltas.wait()
        if not (batch := deltas.take()):
            return  # closed (no one wakes it without an item) and drained
        for delta in batch:
            if isinstance(delta, BaseException):
                raise delta
            ch = call.choices[delta.index]
            if ch.finish is not None:
                continue  # cut at a stop string: later tokens are not part of the choice
            start = len(ch.ids)
            apply(ch, delta)
            yield ch, start
            if ch.stop_string and all(c.finish is not None for c in call.choices):
                call.producer.cancel()
                # Shielded: the consumer's scope may be cancelled already (a close or disconnect
                # in the same tick), and the engine must still stop sampling.
                with anyio.CancelScope(shield=True), contextlib.suppress(EngineError):
                    await call.engine.abort(call.request_id)
                return


async def run_to_end(call: Call, table: TokenText) -> None:
    """Generate every choice of a non-streamed call in this task: the engine's deltas are turned
    into text as they come, with no producer task or mailbox between (one task wake-up a delta
    instead of two: `engine_events` is for a consumer that yields elsewhere between deltas).
    The engine's stream is closed, then its request aborted, when this ends with a choice
    unfinished (an error, a cancellation) or once every choice is cut at a stop string. Raises the
    engine's error."""
    apply = _DeltaText(call, table)
    request = call.request()
    stopped = False
    try:
        with call.producer:
            async with contextlib.aclosing(call.engine.generate(request)) as stream:
                async for delta in stream:
                    ch = call.choices[delta.index]
                    if ch.finish is not None:
                        continue  # cut at a stop string: later tokens are not part of the choice
                    apply(ch, delta)
                    if ch.stop_string and all(c.finish is not None for c in call.choices):
                        stopped = True
                        break
    finally:
        # After the stream is closed: an engine may finish its own request's bookkeeping in this
        # task (VLLMEngine's abort waits for the generator it drives, which runs here).
        if stopped or any(ch.finish is None for ch in call.choices):
            with anyio.CancelScope(shield=True), contextlib.suppress(EngineError):
                await call.engine.abort(call.request_id)


class _DeltaText:
    """Adds one engine delta to its choice: token IDs, logprobs, versions, the visible text
    (`new_text` is the delta's), and the finish, cut at the call's stop strings."""

    __slots__ = ("stops", "stop_ids", "min_tokens", "longest", "ints", "table")

    def __init__(self, call: Call, table: TokenText) -> None:
        self.stops, self.stop_ids = call.stops, set(call.sampling.stop_token_ids)
        self.min_tokens = call.sampling.min_tokens
        self.longest = max((len(s) for s in self.stops), default=0)
        self.ints, self.table = table.ints, table

    def __call__(self, ch: Choice, delta: TokenDelta) -> None:
        stops, stop_ids, longest, ints = self.stops, self.stop_ids, self.longest, self.ints
        nints = len(ints)
        added = []
        if delta.top_ids is not None and delta.top_logprobs is not None:
            ch.top_ids += delta.top_ids
            ch.top_lps += delta.top_logprobs
        for tok, lp, ver in zip(delta.token_ids, delta.logprobs, delta.versions, strict=True):
            ch.ids.append(ints[tok] if 0 <= tok < nints else tok)
            ch.lps.append(lp)
            ch.vers.append(ver)
            if tok in stop_ids:
                continue
            piece = ch.decoder.push(tok)
            if stops and piece:
                window, at = ch.tail + piece, len(ch.tail)
                # A stop string ends in this token's text, after the first `min_tokens` (vLLM).
                hits = (
                    [q for q in (window.find(s, max(0, at - len(s) + 1)) for s in stops) if q >= 0]
                    if len(ch.ids) > self.min_tokens
                    else []
                )
                if hits:  # keep the text before the stop string, nothing of it or after it
                    keep = min(hits) - len(ch.tail)
                    if keep >= 0:
                        added.append(piece[:keep])
                    else:
                        ch.parts.extend(added)
                        added = []
                        ch.cut_tail(-keep)
                    ch.finish, ch.stop_string = "stop", True
                    break
                ch.tail = window[-(longest - 1) :] if longest > 1 else ""
            added.append(piece)
        if ch.finish is None and delta.finish_reason is not None:
            added.append(ch.decoder.end())
            ch.finish = delta.finish_reason
        ch.new_text = "".join(added)
        ch.parts.append(ch.new_text)


def _hold_len(text: str, stop: str) -> int:
    """Characters at the end of `text` that may be the start of `stop` (held back when
    streaming)."""
    for k in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:k]):
            return k
    return 0
