"""The TITO proxy: an OpenAI-compatible HTTP API in front of the inference engines.

Owns `TitoProxy` (the Starlette ASGI app, sessions, rendering, generation and recording) and
`serve`. Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`, and
`GET /gyre/v1/executions/{id}/calls`. Every choice of every call becomes one `ModelCall` with the
exact prompt IDs the engine ran on and the exact completion IDs, behaviour logprobs and weight
versions it sampled; every choice carries its `token_ids`, and `return_token_ids: true` (vLLM's
flag) adds `prompt_token_ids`. The engine is found per execution through `engine_for(execution_id)`
(the router plugs in there). Stop strings: generation stops once the decoded text contains one;
the returned text ends before it, while every token sampled up to and including the one that
completed it is recorded (they were sampled and carry logprobs), so the next turn branches there.
Knows nothing about trees, scoring or training.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import msgspec
import sniffio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from gyre.config import ProxyConfig, RunConfig
from gyre.engines.protocol import FinishReason, GenerateRequest, InferenceEngine, SamplingParams
from gyre.errors import EngineError, GyreError, ProxyError
from gyre.tito.log import CallLog
from gyre.tito.records import ExecutionSummary, ModelCall, Role
from gyre.tito.detok import TokenText
from gyre.tito.render import ChatRenderer, Node, Rendered, RenderStatistics
from gyre.tito.reply import ReplyStream, parse_reply
from gyre.tito.sessions import Execution, Sessions, parse_role
from gyre.tito.wire import (
    CHAT_DECODER,
    COMPLETION_DECODER,
    JSON_ENCODER,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    error_body,
    message_text,
)

__all__ = ["TitoProxy", "ProxyStatistics"]

logger = logging.getLogger(__name__)

_CALLS_ENCODER = msgspec.json.Encoder()
_INLINE_RENDER_BYTES = 32 * 1024
"""Chat requests adding up to this much text to a known parent (or whose whole body is this
small) are rendered on the event loop thread; others in a worker thread."""


class ProxyStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of the proxy's counters (STYLE.md rule 6)."""

    open_executions: int
    requests_total: int
    """HTTP requests to the OpenAI routes."""
    requests_refused: int
    """Requests answered with a 4xx or 5xx error."""
    calls_recorded: int
    """ModelCall records written (one per choice)."""
    completion_tokens: int
    """Completion tokens recorded."""
    rendered_fast: int
    """Chat prompts spliced from the parent's tokens + the new messages only."""
    rendered_full: int
    """Chat prompts rendered from the whole conversation."""
    render_check_failures: int
    """Incremental renders that disagreed with a full render (then rendered in full)."""
    divergences: int
    """Prompts that branch off their parent's prompt + completion."""


@dataclass(slots=True)
class _Choice:
    """One choice being generated."""

    index: int
    decoder: Any
    ids: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    vers: list[int] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)
    """Visible text in pieces (joined once, by `text`): stop tokens excluded, cut before a stop string."""
    tail: str = ""
    """The last characters of the visible text (where a stop string may be starting)."""
    new_text: str = ""
    """Visible text added by the latest engine delta (for streaming)."""
    finish: FinishReason | None = None
    stop_string: bool = False
    pending: str = ""
    """Streaming: text held back because it may be the start of a stop string."""
    stream: ReplyStream | None = None
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


@dataclass(slots=True)
class _Call:
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
    choices: list[_Choice]
    chat: bool = True
    recorded: bool = False
    created: int = 0
    producer: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    """Cancel scope of the task that iterates the engine (cancelled to stop generating)."""

    @property
    def request_id(self) -> str:
        return f"{self.execution.execution_id}/{self.call_id}"

    @classmethod
    def start(
        cls, execution: Execution, engine: InferenceEngine, role: Role, started_s: float, rendered: Rendered,
        sampling: SamplingParams, stops: tuple[str, ...], **kind: Any,
    ) -> _Call:
        """A new call of `execution` (its next call ID), one `_Choice` per sample; `kind` sets
        `parse_tools`, `chat` and `template_kwargs`."""
        choices = [_Choice(index=i, decoder=TokenText.incremental()) for i in range(sampling.n)]
        return cls(execution=execution, engine=engine, role=role, call_id=execution.new_call_id(),
                   started_s=started_s, rendered=rendered, sampling=sampling, stops=stops, choices=choices,
                   created=int(started_s), **kind)


def _choice_call_id(call: _Call, index: int) -> str:
    return call.call_id if call.sampling.n == 1 else f"{call.call_id}/{index}"


class TitoProxy:
    """The OpenAI-compatible proxy of one node.

    Args:
        tokenizer: the served model's `transformers` fast tokenizer (with its chat template).
        engine_for: the engine serving an execution (a router later; one engine for now).
        config: `ProxyConfig`.
        log_path: the append-only call log; None keeps records in memory only (tests).

    Use: `key = proxy.mint_key(execution_id)` for each execution (the agent gets
    `OPENAI_BASE_URL=http://host:port/v1`, `OPENAI_API_KEY=key`); `await proxy.close(execution_id)`
    when it ends; `await task_group.start(proxy.serve)` returns the bound port.
    """

    def __init__(
        self,
        *,
        tokenizer: Any,
        engine_for: Callable[[str], InferenceEngine],
        config: ProxyConfig = ProxyConfig(),
        log_path: str | None = None,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.engine_for = engine_for
        self.sessions = Sessions()
        self.renderer = ChatRenderer(tokenizer, check_every=config.render_check_every)
        self.text: TokenText = self.renderer.text
        self.log = CallLog(log_path) if log_path is not None else None
        eos = tokenizer.eos_token_id
        self.stop_token_ids: tuple[int, ...] = () if eos is None else (eos,)
        self._counts = dict(requests_total=0, requests_refused=0, calls_recorded=0, completion_tokens=0)
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/completions", self._completions, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/gyre/v1/executions/{execution_id}/calls", self._list_calls, methods=["GET"]),
            ],
            exception_handlers={HTTPException: self._http_exception},
        )

    @classmethod
    def for_run(
        cls, run: RunConfig, *, tokenizer: Any, engine_for: Callable[[str], InferenceEngine]
    ) -> TitoProxy:
        """The proxy of a run: `run.proxy` settings, call log at `<run_dir>/<log_name>`."""
        log_path = Path(run.run_dir) / run.proxy.log_name
        return cls(tokenizer=tokenizer, engine_for=engine_for, config=run.proxy, log_path=str(log_path))

    # -- launcher API -------------------------------------------------------------------------

    def mint_key(self, execution_id: str) -> str:
        """Open `execution_id` and return the API key its agent uses. ValueError if already open."""
        return self.sessions.mint_key(execution_id)

    async def close(self, execution_id: str) -> ExecutionSummary:
        """End an execution: its key stops working, its summary is logged and the log fsynced.

        Raises KeyError if the execution is not open."""
        ex = self.sessions.pop(execution_id)
        summary = ex.summary()
        if self.log is not None:
            await self.log.append_end(summary)
        return summary

    def calls(self, execution_id: str) -> list[ModelCall]:
        """The calls recorded so far for an open execution (KeyError if it is not open)."""
        ex = self.sessions.get(execution_id)
        if ex is None:
            raise KeyError(execution_id)
        return ex.calls()

    def summary(self, execution_id: str) -> ExecutionSummary:
        """The running summary of an open execution (KeyError if it is not open)."""
        ex = self.sessions.get(execution_id)
        if ex is None:
            raise KeyError(execution_id)
        return ex.summary()

    def statistics(self) -> ProxyStatistics:
        r: RenderStatistics = self.renderer.stats
        return ProxyStatistics(
            open_executions=len(self.sessions.open_executions()),
            rendered_fast=r.fast,
            rendered_full=r.full,
            render_check_failures=r.check_failures,
            divergences=r.divergences,
            **self._counts,
        )

    async def serve(
        self, *, host: str | None = None, port: int | None = None, task_status=anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve the API with Hypercorn in the current event loop (trio or asyncio) until cancelled.

        Binds first, then reports the bound port through `task_status` (so
        `port = await tg.start(proxy.serve)` can connect at once). Also runs the log's fsync timer.
        Raises OSError if the address cannot be bound.
        """
        from hypercorn.config import Config as HypercornConfig

        if sniffio.current_async_library() == "trio":
            from hypercorn.trio import serve as hypercorn_serve
        else:
            from hypercorn.asyncio import serve as hypercorn_serve
        host = self.config.host if host is None else host
        port = self.config.port if port is None else port
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.bind((host, port))
            sock.listen(1024)
            bound = sock.getsockname()[1]
        except BaseException:
            sock.close()
            raise
        hc = HypercornConfig()
        hc.bind = [f"fd://{sock.detach()}"]  # Hypercorn owns and closes the socket from here
        hc.accesslog = None
        hc.errorlog = logger
        hc.graceful_timeout = 1.0
        shutdown = anyio.Event()

        async def run_server() -> None:
            # Hypercorn shuts down through its trigger, not by cancellation (its asyncio worker
            # mishandles CancelledError); the shield lasts for the graceful period at most.
            with anyio.CancelScope(shield=True):
                await hypercorn_serve(self.app, hc, shutdown_trigger=shutdown.wait, mode="asgi")

        async with anyio.create_task_group() as tg:
            if self.log is not None:
                tg.start_soon(self.log.run_flusher, self.config.flush_interval_s)
            tg.start_soon(run_server)
            task_status.started(bound)
            try:
                await anyio.sleep_forever()
            finally:
                shutdown.set()
                tg.cancel_scope.cancel()

    # -- HTTP plumbing ------------------------------------------------------------------------

    def _error(self, exc: Exception) -> Response:
        """The OpenAI-shaped error response for `exc`: a `GyreError` carries its own HTTP status
        and type (`gyre.errors`); anything else is a logged 500."""
        self._counts["requests_refused"] += 1
        status, type_, code, param = 500, "server_error", None, None
        if isinstance(exc, GyreError):
            status, type_ = exc.http_status, exc.http_type
            code = exc.error_code if isinstance(exc, ProxyError) else exc.code
            param = exc.param if isinstance(exc, ProxyError) else None
        if status == 500:
            logger.exception("proxy request failed")
        return Response(
            error_body(str(exc), type=type_, code=code, param=param),
            status_code=status,
            media_type="application/json",
        )

    async def _http_exception(self, request: Request, exc: HTTPException) -> Response:
        return self._error(
            _proxy_error(exc.detail, exc.status_code, "not_found" if exc.status_code == 404 else None)
        )

    async def _body(self, request: Request) -> bytes:
        """The request body, at most `max_body_bytes`; a larger one is read to its end (up to 8x
        the cap, so the client gets the 413 rather than a reset connection) and refused. A client that
        disconnects mid-body is refused with status 499 (nginx's "client closed request")."""
        cap = self.config.max_body_bytes
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size <= cap:
                    chunks.append(chunk)
                elif size > 8 * cap:
                    break
        except ClientDisconnect:  # an agent killed at its deadline mid-request: routine, not a crash
            raise _proxy_error("the client closed the connection before its request body ended", 499,
                               "client_closed_request") from None
        if size > cap:
            raise _proxy_error(
                f"request body of {size}+ bytes exceeds the limit of {cap} bytes", 413, "request_too_large"
            )
        return b"".join(chunks)

    def _resolve(self, request: Request) -> Execution:
        return self.sessions.resolve(
            request.headers.get("authorization"), request.headers.get("x-gyre-execution")
        )

    def _decode(self, decoder: msgspec.json.Decoder, body: bytes):
        try:
            return decoder.decode(body)
        except msgspec.ValidationError as exc:
            raise _proxy_error(
                f"invalid request: {exc}", 400, "invalid_type", param=_param_of(str(exc))
            ) from None
        except msgspec.DecodeError as exc:
            raise _proxy_error(f"malformed JSON body: {exc}", 400, "invalid_json") from None

    def _check_model(self, model: str) -> None:
        if model != self.config.model_name:
            raise _proxy_error(
                f"the model {model!r} does not exist (served: {self.config.model_name!r})",
                404,
                "model_not_found",
                param="model",
                type="invalid_request_error",
            )

    async def _models(self, request: Request) -> Response:
        body = {
            "object": "list",
            "data": [{"id": self.config.model_name, "object": "model", "created": 0, "owned_by": "gyre"}],
        }
        return Response(JSON_ENCODER.encode(body), media_type="application/json")

    async def _list_calls(self, request: Request) -> Response:
        try:
            ex = self._resolve(request)
            execution_id = request.path_params["execution_id"]
            if ex.execution_id != execution_id:
                raise _proxy_error(
                    f"the key does not belong to execution {execution_id!r}",
                    403,
                    "forbidden",
                    type="permission_error",
                )
            body = _CALLS_ENCODER.encode(
                {"object": "list", "execution_id": execution_id, "data": ex.calls(), "summary": ex.summary()}
            )
            return Response(body, media_type="application/json")
        except ProxyError as exc:
            return self._error(exc)

    # -- request preparation ------------------------------------------------------------------

    def _sampling(
        self,
        req: ChatCompletionRequest | CompletionRequest,
        max_tokens: int | None,
        prompt_len: int,
        ex: Execution,
        engine: InferenceEngine,
    ) -> SamplingParams:
        """Sampling params with the context limit applied (B15): clamp or refuse, never a crash."""
        if not 1 <= req.n <= self.config.max_n:
            raise _proxy_error(
                f"n={req.n} must be in [1, {self.config.max_n}]", 400, "invalid_value", param="n"
            )
        if max_tokens is not None and max_tokens < 1:
            raise _proxy_error(
                f"max_tokens={max_tokens} must be >= 1", 400, "invalid_value", param="max_tokens"
            )
        temperature = 1.0 if req.temperature is None else req.temperature
        if not (math.isfinite(temperature) and 0 <= temperature <= 2):
            raise _proxy_error(
                f"temperature={temperature} must be in [0, 2]", 400, "invalid_value", param="temperature"
            )
        top_p = 1.0 if req.top_p is None else req.top_p
        if not 0 < top_p <= 1:
            raise _proxy_error(f"top_p={top_p} must be in (0, 1]", 400, "invalid_value", param="top_p")
        max_model_len = engine.statistics().max_model_len
        room = max_model_len - prompt_len
        wanted = room if max_tokens is None else max_tokens
        if room < 1 or (wanted > room and self.config.context_overflow == "refuse"):
            ex.truncated = True
            ex.context_refusals += 1
            raise _proxy_error(
                f"this model's maximum context length is {max_model_len} tokens; the prompt has "
                f"{prompt_len} tokens and {wanted} completion tokens were requested",
                400,
                "context_length_exceeded",
                param="messages",
            )
        return SamplingParams(
            max_tokens=min(wanted, room),
            temperature=temperature,
            top_p=top_p,
            top_k=req.top_k or 0,
            seed=req.seed,
            stop_token_ids=self.stop_token_ids
            + tuple(t for t in req.stop_token_ids or () if t not in self.stop_token_ids),
            n=req.n,
        )

    @staticmethod
    def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        if len(stops) > 16 or any(not s for s in stops):
            raise _proxy_error(
                "stop must be at most 16 non-empty strings", 400, "invalid_value", param="stop"
            )
        return stops

    # -- generation ---------------------------------------------------------------------------

    async def _produce(self, call: _Call, send: MemoryObjectSendStream) -> None:
        """Iterate the engine's generator in this one task (engines may hold cancel scopes across
        their yields) and pass each delta on; an engine error is passed on as an item."""
        request = GenerateRequest(
            request_id=call.request_id, prompt_ids=call.rendered.prompt_ids, sampling=call.sampling
        )
        async with send:
            with call.producer:
                try:
                    async with contextlib.aclosing(call.engine.generate(request)) as deltas:
                        async for delta in deltas:
                            await send.send(delta)
                except EngineError as exc:
                    await send.send(exc)

    @contextlib.asynccontextmanager
    async def _engine_events(self, call: _Call) -> AsyncIterator[AsyncIterator[tuple[_Choice, int]]]:
        """Run the engine for `call` in a producer task; yields the events iterator (see `_events`).
        Leaving the block stops the engine (the producer is cancelled and the request aborted)."""
        send, receive = anyio.create_memory_object_stream(math.inf)
        error: Exception | None = None
        async with anyio.create_task_group() as tg, receive:
            tg.start_soon(self._produce, call, send)
            try:
                yield self._events(call, receive)
            except Exception as exc:  # re-raised below as itself, not inside an ExceptionGroup
                error = exc
            finally:
                if not call.producer.cancel_called and any(ch.finish is None for ch in call.choices):
                    call.producer.cancel()
                    with anyio.CancelScope(shield=True), contextlib.suppress(EngineError):
                        await call.engine.abort(call.request_id)
        if error is not None:
            raise error

    async def _events(
        self, call: _Call, receive: MemoryObjectReceiveStream
    ) -> AsyncIterator[tuple[_Choice, int]]:
        """After each engine delta yield (choice, index of its first new token); a choice's
        finish is set on the yield that ends it. Raises the engine's error."""
        stops, stop_ids = call.stops, set(call.sampling.stop_token_ids)
        longest = max((len(s) for s in stops), default=0)
        table = self.text
        ints, nints = table.ints, len(table.ints)
        async for delta in receive:
            if isinstance(delta, BaseException):
                raise delta
            ch = call.choices[delta.index]
            if ch.finish is not None:
                continue  # cut at a stop string: later tokens are not part of the choice
            start = len(ch.ids)
            added = []
            for tok, lp, ver in zip(delta.token_ids, delta.logprobs, delta.versions, strict=True):
                ch.ids.append(ints[tok] if 0 <= tok < nints else tok)
                ch.lps.append(lp)
                ch.vers.append(ver)
                if tok in stop_ids:
                    continue
                piece = ch.decoder.decode(table.token_bytes(tok))
                if stops and piece:
                    window = ch.tail + piece
                    hits = [q for q in (window.find(s) for s in stops) if q >= 0]
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
                added.append(ch.decoder.decode(b"", final=True))
                ch.finish = delta.finish_reason
            ch.new_text = "".join(added)
            ch.parts.append(ch.new_text)
            yield ch, start
            if ch.stop_string and all(c.finish is not None for c in call.choices):
                call.producer.cancel()
                with contextlib.suppress(EngineError):
                    await call.engine.abort(call.request_id)
                return

    async def _run_to_end(self, call: _Call) -> None:
        """Generate every choice of a non-streamed call; on failure keep what was sampled."""
        try:
            async with self._engine_events(call) as events:
                async for _ in events:
                    pass
        except BaseException:
            await self._record_partial(call, chat=call.chat)
            raise

    def _reply_message(self, call: _Call, ch: _Choice) -> tuple[dict[str, Any], ChatMessage]:
        """(JSON message for the client, the ChatMessage the renderer compares echoes with)."""
        tool_id = f"call_{call.execution.execution_id}_{_choice_call_id(call, ch.index)}".replace("/", "_")
        parsed = parse_reply(ch.text, tool_id, tools=call.parse_tools)
        calls = list(parsed.tool_calls) or None
        content = parsed.content if parsed.content or not calls else None
        msg = ChatMessage(
            role="assistant", content=content, reasoning_content=parsed.reasoning, tool_calls=calls
        )
        out: dict[str, Any] = {"role": "assistant", "content": content}
        if parsed.reasoning is not None:
            out["reasoning_content"] = parsed.reasoning
        if calls:
            out["tool_calls"] = [
                {
                    "id": tc.id,
                    "type": "function",
                    "function": {"name": tc.function.name, "arguments": tc.function.arguments},
                }
                for tc in calls
            ]
        if parsed.tool_call_error is not None and ch.finish != "length":
            # A reply cut off by max_tokens is truncated, not malformed (B15): no tool error.
            out["gyre_tool_call_error"] = parsed.tool_call_error
        return out, msg

    async def _record(self, call: _Call, replies: list[ChatMessage | None]) -> list[ModelCall]:
        """Record every choice (log first, then memory): the response may complete after this."""
        if call.recorded:
            return []
        call.recorded = True
        ex, rendered = call.execution, call.rendered
        parent = rendered.parent
        base = None
        if parent is not None and rendered.divergence is None:
            base = (parent.call_id, parent.prompt_len + len(parent.completion_ids))
        now = time.time()
        out = []
        if base is not None and rendered.path != "repeat":
            parent.lend_prefix(rendered.prompt_ids)  # the parent's prompt now lives in this list
        for ch, reply in zip(call.choices, replies):
            finish: FinishReason = ch.finish or "abort"
            mc = ModelCall(
                execution_id=ex.execution_id,
                call_id=_choice_call_id(call, ch.index),
                role=call.role,
                prompt_ids=rendered.prompt_ids,
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
            )
            if self.log is not None:
                await self.log.append_call(mc, base=base)
            node = Node(
                call_id=mc.call_id,
                prompt_ref=rendered.prompt_ids,
                completion_ids=ch.ids,
                completion_text=self.text.decode(ch.ids),
                messages=rendered.messages,
                reply=reply,
                tools=rendered.tools,
                template_kwargs=call.template_kwargs,
                stop_string=ch.stop_string,
                parent=parent,
                divergence=rendered.divergence,
            )
            ex.render.nodes.append(node)
            ex.add(mc, node)
            self._counts["calls_recorded"] += 1
            self._counts["completion_tokens"] += len(ch.ids)
            out.append(mc)
        return out

    async def _record_partial(self, call: _Call, chat: bool) -> None:
        """A response that did not complete (client gone, engine error): abort, keep the tokens.
        A request that produced no token records nothing."""
        if call.recorded or not any(ch.ids for ch in call.choices):
            return
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(EngineError):
                await call.engine.abort(call.request_id)
            replies = [self._reply_message(call, ch)[1] if chat else None for ch in call.choices]
            await self._record(call, replies)

    def _logprobs_chat(self, ids: list[int], lps: list[float], top: int | None) -> dict[str, Any]:
        content = []
        for t, lp in zip(ids, lps):
            b = self.text.token_bytes(t)
            s = b.decode("utf-8", errors="replace")
            entry = {"token": s, "logprob": lp, "bytes": list(b), "top_logprobs": []}
            if top:  # the engine reports only the sampled token's logprob
                entry["top_logprobs"] = [{"token": s, "logprob": lp, "bytes": list(b)}]
            content.append(entry)
        return {"content": content}

    def _logprobs_text(self, ids: list[int], lps: list[float], offset: int) -> dict[str, Any]:
        tokens = [self.text.token_str(t) for t in ids]
        offsets = []
        for s in tokens:
            offsets.append(offset)
            offset += len(s)
        return {
            "tokens": tokens,
            "token_logprobs": list(lps),
            "top_logprobs": [{s: lp} for s, lp in zip(tokens, lps)],
            "text_offset": offsets,
        }

    def _usage(self, call: _Call) -> dict[str, int]:
        p = len(call.rendered.prompt_ids)
        c = sum(len(ch.ids) for ch in call.choices)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def _gyre_info(self, call: _Call) -> dict[str, Any]:
        r = call.rendered
        return {
            "execution_id": call.execution.execution_id,
            "call_id": call.call_id,
            "parent_call_id": None if r.parent is None else r.parent.call_id,
            "divergence": None if r.divergence is None else msgspec.to_builtins(r.divergence),
        }

    # -- chat completions ---------------------------------------------------------------------

    async def _chat(self, request: Request) -> Response:
        self._counts["requests_total"] += 1
        try:
            ex = self._resolve(request)
            role = parse_role(request.headers.get("x-gyre-role"))
            body = await self._body(request)
            req: ChatCompletionRequest = self._decode(CHAT_DECODER, body)
            self._check_model(req.model)
            if not req.messages:
                raise _proxy_error("messages must not be empty", 400, "invalid_value", param="messages")
            try:
                for m in req.messages:
                    message_text(m.content)
            except ValueError as exc:
                raise _proxy_error(str(exc), 400, "invalid_value", param="messages") from None
            started = time.time()
            engine = self.engine_for(ex.execution_id)
            tools = req.tools or None
            parent = self.renderer.find_parent(ex.render, req.messages, tools, req.chat_template_kwargs)

            def render() -> Rendered:
                return self.renderer.render_chat(
                    ex.render,
                    req.messages,
                    tools,
                    add_generation_prompt=req.add_generation_prompt,
                    template_kwargs=req.chat_template_kwargs,
                    parent=parent,
                )

            # Rendering a few new messages takes microseconds, less than a thread hop; rendering
            # and tokenizing much text (a first call, a full re-render) must not block the loop.
            new_bytes = (
                len(body)
                if parent is None or self.renderer.check_due(ex.render)
                else sum(len(message_text(m.content) or "") for m in req.messages[len(parent.messages) :])
            )
            try:
                rendered = (
                    render() if new_bytes <= _INLINE_RENDER_BYTES else await anyio.to_thread.run_sync(render)
                )
            except Exception as exc:  # jinja raises its own errors for messages a template rejects
                if isinstance(exc, ProxyError):
                    raise
                raise _proxy_error(
                    f"the chat template cannot render these messages: {exc}",
                    400,
                    "invalid_messages",
                    param="messages",
                ) from None
            max_tokens = (
                req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
            )
            sampling = self._sampling(req, max_tokens, len(rendered.prompt_ids), ex, engine)
            call = _Call.start(
                ex, engine, role, started, rendered, sampling, self._stops(req.stop),
                parse_tools=bool(tools) and req.tool_choice != "none", template_kwargs=req.chat_template_kwargs,
            )
            if req.stream:
                return _SSEResponse(self, call, lambda events: self._chat_stream(call, req, events))
            await self._run_to_end(call)
            replies = [self._reply_message(call, ch) for ch in call.choices]
            await self._record(call, [r[1] for r in replies])
            body = {
                "id": f"chatcmpl-{call.request_id}",
                "object": "chat.completion",
                "created": call.created,
                "model": self.config.model_name,
                "choices": [
                    {
                        "index": ch.index,
                        "message": msg,
                        "logprobs": self._logprobs_chat(ch.ids, ch.lps, req.top_logprobs)
                        if req.logprobs
                        else None,
                        "finish_reason": "tool_calls" if msg.get("tool_calls") else ch.finish,
                        "token_ids": ch.ids,
                    }
                    for ch, (msg, _) in zip(call.choices, replies)
                ],
                "usage": self._usage(call),
                "gyre": self._gyre_info(call),
            }
            if req.return_token_ids:
                body["prompt_token_ids"] = rendered.prompt_ids
            return Response(JSON_ENCODER.encode(body), media_type="application/json")
        except (ProxyError, EngineError) as exc:
            return self._error(exc)

    def _chunk(self, call: _Call, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        body = {
            "id": f"chatcmpl-{call.request_id}",
            "object": "chat.completion.chunk",
            "created": call.created,
            "model": self.config.model_name,
            "choices": choices,
            **extra,
        }
        return b"data: " + JSON_ENCODER.encode(body) + b"\n\n"

    async def _chat_stream(self, call: _Call, req: ChatCompletionRequest, events) -> AsyncIterator[bytes]:
        """SSE chunks: every engine delta becomes one chunk carrying its token IDs and logprobs,
        even when it adds no text (B04); tool calls are sent whole when their choice ends."""
        hold = call.stops
        started = set()
        try:
            first = True
            async for ch, start in events:
                new_ids, new_lps = ch.ids[start:], ch.lps[start:]
                delta: dict[str, Any] = {}
                if ch.index not in started:
                    started.add(ch.index)
                    delta["role"] = "assistant"
                if ch.finish is None:
                    if ch.stream is None:
                        ch.stream = ReplyStream(tools=call.parse_tools)
                    pending = ch.pending + ch.new_text
                    held = max((_hold_len(pending, s) for s in hold), default=0)
                    ch.pending = pending[len(pending) - held :]
                    r, c = ch.stream.feed(pending[: len(pending) - held])
                    if r:
                        delta["reasoning_content"] = r
                        ch.emitted_reasoning += len(r)
                    if c:
                        delta["content"] = c
                        ch.emitted_content += len(c)
                    finish = None
                else:
                    msg, _ = self._reply_message(call, ch)
                    r = msg.get("reasoning_content") or ""
                    c = msg.get("content") or ""
                    if r[ch.emitted_reasoning :]:
                        delta["reasoning_content"] = r[ch.emitted_reasoning :]
                    if c[ch.emitted_content :]:
                        delta["content"] = c[ch.emitted_content :]
                    if msg.get("tool_calls"):
                        delta["tool_calls"] = [dict(tc, index=i) for i, tc in enumerate(msg["tool_calls"])]
                    if "gyre_tool_call_error" in msg:
                        delta["gyre_tool_call_error"] = msg["gyre_tool_call_error"]
                    finish = "tool_calls" if msg.get("tool_calls") else ch.finish
                choice: dict[str, Any] = {
                    "index": ch.index,
                    "delta": delta,
                    "logprobs": self._logprobs_chat(new_ids, new_lps, req.top_logprobs)
                    if req.logprobs
                    else None,
                    "finish_reason": finish,
                }
                choice["token_ids"] = new_ids
                extra = (
                    {"prompt_token_ids": call.rendered.prompt_ids} if first and req.return_token_ids else {}
                )
                first = False
                yield self._chunk(call, [choice], **extra)
            replies = [self._reply_message(call, ch)[1] for ch in call.choices]
            await self._record(call, replies)
            if req.stream_options is not None and req.stream_options.include_usage:
                yield self._chunk(call, [], usage=self._usage(call), gyre=self._gyre_info(call))
            yield b"data: [DONE]\n\n"
        except EngineError as exc:
            if not started:
                raise
            await self._record_partial(call, chat=True)
            yield _sse_error(exc)
        finally:
            await self._record_partial(call, chat=True)

    # -- completions --------------------------------------------------------------------------

    async def _completions(self, request: Request) -> Response:
        self._counts["requests_total"] += 1
        try:
            ex = self._resolve(request)
            role = parse_role(request.headers.get("x-gyre-role"))
            req: CompletionRequest = self._decode(COMPLETION_DECODER, await self._body(request))
            self._check_model(req.model)
            prompt = req.prompt
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
                if len(prompt) != 1:
                    raise _proxy_error(
                        "one prompt per request is supported", 400, "invalid_value", param="prompt"
                    )
                prompt = prompt[0]
            if isinstance(prompt, list) and not all(type(t) is int for t in prompt):
                raise _proxy_error(
                    "prompt must be a string or a list of token IDs", 400, "invalid_type", param="prompt"
                )
            started = time.time()
            engine = self.engine_for(ex.execution_id)
            if isinstance(prompt, str):
                ids = await anyio.to_thread.run_sync(lambda: self.tokenizer.encode(prompt))
            ids = self.text.intern(ids if isinstance(prompt, str) else prompt)
            if not ids:
                raise _proxy_error("prompt must not be empty", 400, "invalid_value", param="prompt")
            rendered = self.renderer.link_tokens(ex.render, ids)
            sampling = self._sampling(req, req.max_tokens, len(ids), ex, engine)
            call = _Call.start(
                ex, engine, role, started, rendered, sampling, self._stops(req.stop),
                parse_tools=False, chat=False, template_kwargs=None,
            )
            if req.stream:
                return _SSEResponse(self, call, lambda events: self._completion_stream(call, req, events))
            await self._run_to_end(call)
            await self._record(call, [None] * len(call.choices))
            body = {
                "id": f"cmpl-{call.request_id}",
                "object": "text_completion",
                "created": call.created,
                "model": self.config.model_name,
                "choices": [
                    {
                        "index": ch.index,
                        "text": ch.text,
                        "logprobs": self._logprobs_text(ch.ids, ch.lps, 0)
                        if req.logprobs is not None
                        else None,
                        "finish_reason": ch.finish,
                        "token_ids": ch.ids,
                    }
                    for ch in call.choices
                ],
                "usage": self._usage(call),
                "gyre": self._gyre_info(call),
            }
            if req.return_token_ids:
                body["prompt_token_ids"] = ids
            return Response(JSON_ENCODER.encode(body), media_type="application/json")
        except (ProxyError, EngineError) as exc:
            return self._error(exc)

    async def _completion_stream(self, call: _Call, req: CompletionRequest, events) -> AsyncIterator[bytes]:
        started = False
        try:
            first = True
            for_offsets = {ch.index: 0 for ch in call.choices}
            async for ch, start in events:
                started = True
                new_ids, new_lps = ch.ids[start:], ch.lps[start:]
                if ch.finish is not None:
                    piece = ch.text[ch.emitted_content :]
                else:
                    pending = ch.pending + ch.new_text
                    held = max((_hold_len(pending, s) for s in call.stops), default=0)
                    piece, ch.pending = pending[: len(pending) - held], pending[len(pending) - held :]
                ch.emitted_content += len(piece)
                choice = {
                    "index": ch.index,
                    "text": piece,
                    "logprobs": self._logprobs_text(new_ids, new_lps, for_offsets[ch.index])
                    if req.logprobs is not None
                    else None,
                    "finish_reason": ch.finish,
                }
                for_offsets[ch.index] += sum(len(self.text.token_str(t)) for t in new_ids)
                choice["token_ids"] = new_ids
                extra = (
                    {"prompt_token_ids": call.rendered.prompt_ids} if first and req.return_token_ids else {}
                )
                first = False
                body = {
                    "id": f"cmpl-{call.request_id}",
                    "object": "text_completion",
                    "created": call.created,
                    "model": self.config.model_name,
                    "choices": [choice],
                    **extra,
                }
                yield b"data: " + JSON_ENCODER.encode(body) + b"\n\n"
            await self._record(call, [None] * len(call.choices))
            if req.stream_options is not None and req.stream_options.include_usage:
                body = {
                    "id": f"cmpl-{call.request_id}",
                    "object": "text_completion",
                    "created": call.created,
                    "model": self.config.model_name,
                    "choices": [],
                    "usage": self._usage(call),
                }
                yield b"data: " + JSON_ENCODER.encode(body) + b"\n\n"
            yield b"data: [DONE]\n\n"
        except EngineError as exc:
            if not started:
                raise
            await self._record_partial(call, chat=False)
            yield _sse_error(exc)
        finally:
            await self._record_partial(call, chat=False)


def _hold_len(text: str, stop: str) -> int:
    """Characters at the end of `text` that may be the start of `stop` (held back when streaming)."""
    for k in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:k]):
            return k
    return 0


def _proxy_error(
    message: str, status: int, code: str | None, *, param: str | None = None, type: str | None = None
) -> ProxyError:
    return ProxyError(message, status=status, type=type, error_code=code, param=param)


def _param_of(message: str) -> str | None:
    """The JSON path msgspec names in a validation error (`... - at `$.messages[0].role``)."""
    _, sep, path = message.rpartition("at `")
    return path.rstrip("`").removeprefix("$.") if sep else None


def _sse_error(exc: Exception) -> bytes:
    code = getattr(exc, "code", None)
    return b"data: " + error_body(str(exc), type="server_error", code=code) + b"\n\ndata: [DONE]\n\n"


class _SSEResponse:
    """A server-sent-events response that runs the engine within its own task group.

    The first chunk is produced before the status line is sent, so a request the engine refuses
    still gets a plain HTTP error. A client that disconnects cancels generation; what was
    sampled so far is recorded (finish `abort`).
    """

    def __init__(self, proxy: TitoProxy, call: _Call, chunks: Callable[[Any], AsyncIterator[bytes]]) -> None:
        self.proxy, self.call, self.chunks = proxy, call, chunks

    async def __call__(self, scope, receive, send) -> None:
        async with self.proxy._engine_events(self.call) as events:
            chunks = self.chunks(events)
            try:
                try:
                    first = await anext(chunks)
                except (ProxyError, EngineError) as exc:
                    await self.proxy._error(exc)(scope, receive, send)
                    return
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_cancel_on_disconnect, receive, tg.cancel_scope)
                    await send(
                        {
                            "type": "http.response.start",
                            "status": 200,
                            "headers": [
                                (b"content-type", b"text/event-stream; charset=utf-8"),
                                (b"cache-control", b"no-cache"),
                            ],
                        }
                    )
                    await send({"type": "http.response.body", "body": first, "more_body": True})
                    async for chunk in chunks:
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    tg.cancel_scope.cancel()
            finally:
                with anyio.CancelScope(shield=True):
                    await chunks.aclose()


async def _cancel_on_disconnect(receive, scope: anyio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return
