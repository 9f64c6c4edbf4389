"""The vLLM inference backend: `VLLMEngine` wraps vLLM's AsyncLLM behind the `InferenceEngine`
protocol. Runs on asyncio inside a cell worker process; the node reaches it through
`gyre.cell.client.CellClient`. Owns how gyre drives vLLM:

- logprobs are vLLM's `processed_logprobs`: the distribution actually sampled from, after the
  structured-output mask, logit bias, penalties, temperature, top-k and top-p (B05; the order of
  vLLM's `Sampler` docstring), one per sampled token, plus that distribution's top k when asked;
- a structured-output constraint becomes vLLM's `StructuredOutputsParams` (xgrammar); a
  constrained choice is never continued after a weight load: it ends with `abort`;
- each of n choices is its own vLLM request seeded `choice_seed(seed, i)` (B22); the request's
  stop IDs decide, not EOS, and the stop token is kept; a one-choice request is driven in its
  consumer's task (one wake-up per vLLM output, every `EngineConfig.stream_interval` tokens),
  n > 1 choices each in a task, merged through a queue; a deadline is one timer per request;
- `load_weights` aborts in-flight requests with their tokens so far (those sampled but not yet
  handed over included, and requests reaching vLLM after its pause: B32), reloads
  (`reload_weights`), resets the prefix cache (B12), bumps the version and continues each
  request from prompt + tokens so far: every token carries the version that sampled it;
- KV migration (`export_kv`, `release_kv`, `kv_import`) goes through the engine's `KVTransport`
  (`gyre.engines.kv_transport`); an import computed with other weights is refused (it prefills:
  `kv_imports_refused`).

Engine settings and sampling parameters in vLLM's terms are `gyre.engines.vllm_params`'. Knows
nothing about chat messages, executions or HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import uuid
from collections.abc import AsyncGenerator
from typing import Any, Final

from gyre._counters import Counters
from gyre.config import EngineConfig
from gyre.engines.kv_transport import KVTransport, kv_transport
from gyre.engines.protocol import (
    Completion,
    EngineStatistics,
    FinishReason,
    GenerateRequest,
    KVExport,
    TokenDelta,
    choice_seed,
)
from gyre.engines.validate import remember_abort, validate_request
from gyre.engines.vllm_params import engine_args, sampled_logprobs, sampling_params, top_entries
from gyre.errors import (
    EngineError,
    EngineTimeoutError,
    EngineUnavailableError,
    GyreError,
    WeightSyncError,
)

__all__ = ["VLLMEngine"]

logger = logging.getLogger(__name__)

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


class _Choice:
    """One choice of one request: what the caller has been given so far."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.ids: list[int] = []
        self.lps: list[float] = []
        self.vers: list[int] = []
        self.finish: FinishReason | None = None
        self.sub_id: str | None = None
        self.user_aborted = False
        self.ended: tuple[FinishReason, int | None] = ("abort", None)
        """The last vLLM attempt's finish and cached prompt tokens."""
        self.done = asyncio.Event()


_DEADLINE: Final = None
"""Queued by a request's deadline timer: wakes its consumer, which then ends it."""

_DRAIN_RETRY_S = 0.05
"""Seconds between a weight load's aborts of its requests still running (an abort that reaches
vLLM before the request it names is a no-op there: B32)."""


def _coalesce(first: TokenDelta | BaseException | None, queue: asyncio.Queue) -> list[TokenDelta]:
    """`first` plus every delta already queued, merged per choice in order (fewer, larger deltas
    when the consumer is slower than the engine; nothing is reordered across a finish); the
    `_DEADLINE` wake-up is skipped."""
    merged: dict[int, TokenDelta] = {}
    out: list[TokenDelta] = []
    item = first
    while True:
        if item is _DEADLINE:
            if queue.empty():
                return out
            item = queue.get_nowait()
            continue
        if isinstance(item, BaseException):
            raise item
        prev = merged.get(item.index)
        if prev is not None and prev.finish_reason is None:
            item = prev.then(item)
            out[out.index(prev)] = item
        else:
            out.append(item)
        merged[item.index] = item
        if queue.empty():
            return out
        item = queue.get_nowait()


class VLLMEngine:
    """`InferenceEngine` over a running vLLM `AsyncLLM` (asyncio only).

    Build with `await VLLMEngine.start(model_path, config)`; `shutdown()` when done. KV migration
    goes through `kv` (default: the transport `config.kv_transfer` names).
    """

    def __init__(
        self,
        llm: Any,
        *,
        vocab_size: int,
        max_model_len: int,
        config: EngineConfig,
        kv: KVTransport | None = None,
    ) -> None:
        self.llm = llm
        self.kv = kv or kv_transport(config)
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.config = config
        self.weight_version = 0
        self._requests: dict[str, list[_Choice]] = {}
        self._tombstones: dict[str, bool] = {}  # aborted before they arrived
        self._active_subs: set[str] = set()
        self._drained = asyncio.Event()
        self._drained.set()
        self._ready = asyncio.Event()  # cleared while weights load
        self._ready.set()
        self._load_lock = asyncio.Lock()
        self._paused = False
        self._broken: str | None = None  # set when a weight load failed half-way
        self._counts = Counters(
            "requests_total",
            "requests_aborted",
            "tokens_generated",
            "weight_loads",
            "prefix_cache_resets",
            "prompt_tokens_computed",
            "kv_tokens_loaded",
        )

    @classmethod
    async def start(
        cls, model_path: str, config: EngineConfig, *, tensor_parallel_size: int = 1
    ) -> VLLMEngine:
        """Start vLLM on `model_path` (a Hugging Face folder), tensor-parallel over
        `tensor_parallel_size` of the devices this process sees. Takes ~20 s on 2 CPU cores."""
        from vllm.v1.engine.async_llm import AsyncLLM

        kv = kv_transport(config)
        kv.prepare()
        args = engine_args(model_path, config, tensor_parallel_size=tensor_parallel_size)
        llm = AsyncLLM.from_engine_args(args)
        model_config = llm.model_config
        return cls(
            llm,
            vocab_size=model_config.get_vocab_size(),
            max_model_len=model_config.max_model_len,
            config=config,
            kv=kv,
        )

    def shutdown(self) -> None:
        """Stop vLLM's engine-core process (idempotent)."""
        llm, self.llm = self.llm, None
        if llm is not None:
            llm.shutdown()
            del llm
            gc.collect()  # run AsyncLLM.__del__ now, while the interpreter is still whole

    # -- generation -------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[TokenDelta, None]:
        self._check_serving(request.request_id)
        max_tokens = validate_request(
            request, vocab_size=self.vocab_size, max_model_len=self.max_model_len
        )
        if request.request_id in self._requests:
            raise EngineUnavailableError(f"request {request.request_id!r} is already running")
        choices = [_Choice(i) for i in range(request.sampling.n)]
        if self._tombstones.pop(request.request_id, False):
            for choice in choices:  # aborted before it arrived: 0 tokens (field case B20)
                self._counts["requests_aborted"] += 1
                yield TokenDelta(
                    index=choice.index,
                    token_ids=[],
                    logprobs=[],
                    versions=[],
                    finish_reason="abort",
                )
            return
        self._requests[request.request_id] = choices
        self._counts["requests_total"] += 1
        if len(choices) == 1:
            try:
                one = self._generate_one(request, choices[0], max_tokens)
                async with contextlib.aclosing(one) as deltas:
                    async for delta in deltas:
                        yield delta
            finally:
                self._requests.pop(request.request_id, None)
            return
        queue: asyncio.Queue[TokenDelta | BaseException | None] = asyncio.Queue()
        tasks = [
            asyncio.create_task(
                self._run_choice(request, choice, max_tokens, queue),
                name=f"{request.request_id}/{choice.index}",
            )
            for choice in choices
        ]
        # One timer per request, not a timeout scope per delta (a scope costs a timer handle
        # scheduled and cancelled at every engine step): at the deadline it wakes the consumer.
        expired: list[bool] = []

        def expire() -> None:
            expired.append(True)
            queue.put_nowait(_DEADLINE)

        timer = asyncio.get_running_loop().call_later(self.config.request_timeout_s, expire)
        try:
            remaining = len(choices)
            last_pass = False  # after the deadline: one pass hands out what was queued by then
            while remaining:
                if expired:
                    if last_pass or queue.empty():
                        await self.abort(request.request_id)
                        raise EngineTimeoutError(
                            f"request {request.request_id!r} exceeded "
                            f"request_timeout_s={self.config.request_timeout_s}"
                        )
                    last_pass = True
                item = await queue.get()
                for delta in _coalesce(item, queue):
                    if delta.finish_reason is not None:
                        remaining -= 1
                    yield delta
        finally:
            timer.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._requests.pop(request.request_id, None)

    async def _generate_one(
        self, request: GenerateRequest, choice: _Choice, max_tokens: int
    ) -> AsyncGenerator[TokenDelta, None]:
        """A one-choice request driven in its consumer's task: no task or queue between vLLM's
        output and the consumer, so a vLLM output costs one wake-up per request, not two. At
        the deadline the choice is aborted in vLLM and `EngineTimeoutError` raised."""
        expired: list[bool] = []

        def expire() -> None:
            expired.append(True)
            choice.user_aborted = True
            if choice.sub_id is not None:
                aborts.add(asyncio.ensure_future(self.llm.abort(choice.sub_id)))

        aborts: set[asyncio.Future] = set()
        timer = asyncio.get_running_loop().call_later(self.config.request_timeout_s, expire)
        try:
            async with contextlib.aclosing(self._drive(request, choice, max_tokens)) as deltas:
                async for delta in deltas:
                    if expired:
                        raise EngineTimeoutError(
                            f"request {request.request_id!r} exceeded "
                            f"request_timeout_s={self.config.request_timeout_s}"
                        )
                    yield delta
        finally:
            timer.cancel()
            if aborts:
                await asyncio.gather(*aborts, return_exceptions=True)

    async def _run_choice(
        self, request: GenerateRequest, choice: _Choice, max_tokens: int, queue: asyncio.Queue
    ) -> None:
        """Drive one choice of several in a task of its own, its deltas into `queue` (an error
        too, which the consumer re-raises). Never raises but `CancelledError`."""
        try:
            async with contextlib.aclosing(self._drive(request, choice, max_tokens)) as deltas:
                async for delta in deltas:
                    queue.put_nowait(delta)
        except BaseException as exc:  # handed to the consumer, who re-raises it
            queue.put_nowait(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise

    async def _drive(
        self, request: GenerateRequest, choice: _Choice, max_tokens: int
    ) -> AsyncGenerator[TokenDelta, None]:
        """Drive one choice through vLLM; continue it after a weight load. Yields its deltas, the
        last one with its finish. Raises `GyreError` (any other error as `EngineError`)."""
        finish: FinishReason
        try:
            attempt = 0
            while True:
                await self._ready.wait()
                if choice.user_aborted:
                    finish, cached = "abort", None
                    break
                self._check_serving(request.request_id)
                async with contextlib.aclosing(
                    self._attempt(request, choice, max_tokens, attempt)
                ) as deltas:
                    async for delta in deltas:
                        yield delta
                finish, cached = choice.ended
                if (
                    finish == "abort"
                    and not choice.user_aborted
                    and len(choice.ids) < max_tokens
                    and request.sampling.structured is None  # a grammar cannot resume mid-way
                ):
                    attempt += 1  # aborted by a weight load: continue from the tokens so far
                    continue
                break
            choice.finish = finish
            if finish == "abort":
                self._counts["requests_aborted"] += 1
            yield TokenDelta(
                index=choice.index,
                token_ids=[],
                logprobs=[],
                versions=[],
                finish_reason=finish,
                cached_tokens=cached,
            )
        except GyreError:
            raise
        except Exception as exc:
            raise EngineError(f"vLLM failed on request {request.request_id!r}: {exc!r}") from exc
        finally:
            choice.done.set()

    async def _attempt(
        self, request: GenerateRequest, choice: _Choice, max_tokens: int, attempt: int
    ) -> AsyncGenerator[TokenDelta, None]:
        """One vLLM request of `choice`: yields its token deltas; leaves (finish, cached tokens)
        in `choice.ended`."""
        from vllm.inputs import TokensPrompt

        s = request.sampling
        seed = choice_seed(s.seed, choice.index)
        if seed is not None and attempt:
            seed = choice_seed(seed, attempt)
        pull = None
        if request.kv_import is not None and attempt == 0:  # never after a weight load
            pull = self.kv.import_params(request.kv_import, weight_version=self.weight_version)
        importing = pull is not None
        params = sampling_params(
            s, max_tokens=max_tokens - len(choice.ids), seed=seed, kv_transfer=pull
        )
        sub_id = f"{request.request_id}/{choice.index}/{attempt}"
        prompt = TokensPrompt(prompt_token_ids=[*request.prompt_ids, *choice.ids])
        outputs = self.llm.generate(prompt, params, sub_id)  # starts at the first iteration
        choice.sub_id = sub_id
        self._active_subs.add(sub_id)
        self._drained.clear()
        finish: FinishReason = "abort"
        cached = None
        counted = False
        try:
            async for out in outputs:
                if not counted and out.num_cached_tokens is not None:
                    counted = True
                    self._counts["prompt_tokens_computed"] += (
                        len(prompt["prompt_token_ids"]) - out.num_cached_tokens
                    )
                    if importing:  # vLLM reports no split between connector and local cache hits
                        self._counts["kv_tokens_loaded"] += out.num_cached_tokens
                if choice.user_aborted:  # tokens after an abort are not handed out: abort()
                    await self.llm.abort(sub_id)  # returns exactly what the stream carried
                    break
                c = out.outputs[0]
                ids = list(c.token_ids)
                if ids:
                    lps = sampled_logprobs(c.logprobs, ids)
                    vers = [self.weight_version] * len(ids)
                    choice.ids += ids
                    choice.lps += lps
                    choice.vers += vers
                    self._counts["tokens_generated"] += len(ids)
                    top_ids = top_lps = None
                    if s.top_logprobs:
                        top_ids, top_lps = top_entries(c.logprobs, len(ids), s.top_logprobs)
                    yield TokenDelta(
                        index=choice.index,
                        token_ids=ids,
                        logprobs=lps,
                        versions=vers,
                        top_ids=top_ids,
                        top_logprobs=top_lps,
                    )
                if attempt == 0 and out.num_cached_tokens is not None:
                    cached = out.num_cached_tokens
                if out.finished:
                    finish = _FINISH.get(str(c.finish_reason), "abort")
        finally:
            await outputs.aclose()  # a consumer that left: vLLM aborts the request
            self._active_subs.discard(sub_id)
            choice.sub_id = None
            if not self._active_subs:
                self._drained.set()
            choice.ended = (finish, cached)

    def _check_serving(self, request_id: str) -> None:
        if self._broken is not None:
            raise EngineUnavailableError(f"request {request_id!r} refused: {self._broken}")
        if self._paused:
            raise EngineUnavailableError(f"request {request_id!r} refused: engine is paused")

    async def abort(self, request_id: str) -> list[Completion]:
        choices = self._requests.get(request_id)
        if choices is None:
            remember_abort(self._tombstones, request_id)
            return []
        for choice in choices:
            choice.user_aborted = True
        subs = [c.sub_id for c in choices if c.sub_id is not None]
        if subs:
            await self.llm.abort(subs)
        await asyncio.wait_for(
            asyncio.gather(*(c.done.wait() for c in choices)), timeout=self.config.request_timeout_s
        )
        return [
            Completion(
                index=c.index,
                token_ids=list(c.ids),
                logprobs=list(c.lps),
                versions=list(c.vers),
                finish_reason=c.finish or "abort",
            )
            for c in choices
        ]

    # -- KV migration -----------------------------------------------------------------------

    async def export_kv(self, token_ids: list[int]) -> KVExport:
        """Export the KV of `token_ids` (a request's prompt + tokens so far) for another engine,
        through `self.kv` (see `KVTransport.export`); at most `request_timeout_s`.
        Raises `EngineUnavailableError` (no connector, paused, weights changed meanwhile),
        `InvalidRequestError` (shorter than one block + 1 token, or no room for one more token),
        `EngineTimeoutError` (`request_timeout_s`), `EngineError` (nothing was exported).
        """
        ids = list(token_ids)
        self.kv.check_export(ids, max_model_len=self.max_model_len)
        self._check_serving("export_kv")
        return await self.kv.export(self, ids)

    async def release_kv(self, key: str) -> bool:
        """Delete export `key` after its import (`KVTransport.release`); False if already gone or
        nothing to delete. Raises `InvalidRequestError` (malformed key), `EngineUnavailableError`
        (no connector)."""
        return await self.kv.release(key)

    async def wait_ready(self) -> None:
        """Return once no weight load runs (`KVHost`)."""
        await self._ready.wait()

    async def run_export_request(
        self, token_ids: list[int], kv_transfer_params: dict[str, Any]
    ) -> tuple[str, dict[str, Any] | None]:
        """Run `token_ids` as a greedy 1-token request carrying `kv_transfer_params` for the KV
        transport, counted in flight so that a weight load waits for it (`KVHost`); returns
        (its request ID, the last `kv_transfer_params` vLLM returned, None if none). Raises
        `EngineUnavailableError` when a weight load aborted it meanwhile (B32)."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = VSamplingParams(
            max_tokens=1,
            temperature=0.0,
            ignore_eos=True,
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
            extra_args={"kv_transfer_params": kv_transfer_params},
        )
        rid = f"gyre-export-{uuid.uuid4().hex}"
        handle = None
        self._active_subs.add(rid)  # a weight load waits for it
        self._drained.clear()
        try:
            async for out in self.llm.generate(
                TokensPrompt(prompt_token_ids=list(token_ids)), params, rid
            ):
                handle = out.kv_transfer_params or handle
        finally:
            self._active_subs.discard(rid)
            if not self._active_subs:
                self._drained.set()
        if not self._ready.is_set():
            raise EngineUnavailableError(f"export_kv: a weight load aborted request {rid}")
        return rid, handle

    # -- weights and scheduling -------------------------------------------------------------

    async def load_weights(self, snapshot: str, version: int) -> None:
        async with self._load_lock:
            self._ready.clear()
            try:
                async with asyncio.timeout(self.config.weight_load_timeout_s):
                    await self.llm.pause_generation(mode="abort", clear_cache=True)
                    await self._drain()
                    try:
                        await self.llm.collective_rpc(
                            "reload_weights", kwargs={"weights_path": snapshot}
                        )
                    except Exception as exc:
                        self._broken = (
                            f"weight load of version {version} from {snapshot!r} failed: {exc}"
                        )
                        raise WeightSyncError(self._broken) from exc
                    if not await self.llm.reset_prefix_cache():
                        self._broken = "prefix cache could not be reset after a weight load"
                        raise WeightSyncError(self._broken)
                    self._counts["prefix_cache_resets"] += 1
                    self.weight_version = version
                    self._broken = None
                    self._counts["weight_loads"] += 1
            except TimeoutError:
                self._broken = f"weight load of version {version} timed out"
                raise WeightSyncError(
                    f"{self._broken} after "
                    f"weight_load_timeout_s={self.config.weight_load_timeout_s}"
                ) from None
            finally:
                await self.llm.resume_generation()
                self._ready.set()

    async def _drain(self) -> None:
        """Return once none of this engine's vLLM requests runs. The pause aborts those vLLM has;
        one that reached it after the pause would wait for `resume_generation`, after this load:
        it is aborted too, every `_DRAIN_RETRY_S` while it runs (B32). No new one starts: choices
        and exports wait for `_ready`."""
        while not self._drained.is_set():
            await self.llm.abort(list(self._active_subs))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_DRAIN_RETRY_S):
                    await self._drained.wait()

    async def pause(self) -> None:
        """Stop serving. With `EngineConfig.sleep_mode` (GPU): let in-flight requests finish, then
        vLLM sleep level 1 (weights offloaded, KV cache freed, memory handed to the trainer).
        Otherwise (CPU, where vLLM has no sleep mode): freeze in-flight requests in place
        (`pause_generation(mode="keep")`); the engine stays resident."""
        self._paused = True
        if self.config.sleep_mode:
            await self.llm.sleep(level=1, mode="wait")
        else:
            await self.llm.pause_generation(mode="keep", clear_cache=False)

    async def resume(self) -> None:
        """Undo `pause()` (vLLM `wake_up` after a sleep); the prefix cache starts empty after
        one."""
        if self.config.sleep_mode:
            await self.llm.wake_up()
            await self.llm.reset_prefix_cache()
        else:
            await self.llm.resume_generation()
        self._paused = False

    def statistics(self) -> EngineStatistics:
        return EngineStatistics(
            weight_version=self.weight_version,
            running_requests=len(self._requests),
            paused=self._paused,
            max_model_len=self.max_model_len,
            vocab_size=self.vocab_size,
            **self._counts,
            **self.kv.statistics().engine_fields(),
        )
