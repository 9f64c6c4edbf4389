"""A scripted fake inference engine with the `InferenceEngine` protocol, for tests above the engine.

Owns `ScriptedReply` and `ScriptedEngine`. Replies come from a queue of scripted token IDs (and
optionally logprobs and a finish reason) or, when the queue is empty, from a deterministic rule on
(prompt, seed, choice). The same request rules as the real engine apply: validation errors, stop
token IDs end a choice with `stop` (token kept), max_tokens and the context limit give `length`,
abort returns the tokens so far. Runs on anyio, so on the node's trio loop and on asyncio.

Sampling controls are honoured where a script can be checked, never ignored: a structured-output
constraint is enforced with xgrammar's `GrammarMatcher` over the engine's tokenizer (the same
grammar engine vLLM uses; without a tokenizer such a request is refused, as is one with bad
words), a token whose `logit_bias` is -100 (banned), outside `allowed_token_ids`, completing a
bad word, or a stop token before `min_tokens` is never emitted, and `top_logprobs` k lists k
tokens per position, the sampled one first. A scripted token these forbid is a broken script:
`EngineError` names it. Temperature, min-p and penalties shape the distribution a script stands
for; the scripted logprobs are taken as that distribution's.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterable
from typing import Any

import anyio
import msgspec

from gyre._counters import Counters
from gyre.engines.protocol import (
    Completion,
    EngineStatistics,
    FinishReason,
    GenerateRequest,
    SamplingParams,
    StructuredOutput,
    TokenDelta,
    choice_seed,
)
from gyre.engines.validate import remember_abort, validate_request
from gyre.errors import EngineError, EngineUnavailableError, InvalidRequestError

__all__ = ["ScriptedReply", "ScriptedEngine", "default_reply"]


class ScriptedReply(msgspec.Struct, frozen=True, kw_only=True):
    """What the fake engine samples for one choice before the request's own limits apply."""

    token_ids: list[int]
    logprobs: list[float] | None = None
    """Behaviour logprob per token; None gives -0.5, -0.51, -0.52, ..."""
    finish_reason: FinishReason | None = None
    """Forced finish reason; None derives it from stop IDs and max_tokens like a real engine."""


def default_reply(request: GenerateRequest, index: int, vocab_size: int) -> ScriptedReply:
    """Deterministic tokens from (prompt, seed, choice): 4-11 tokens, IDs in [3, vocab_size)."""
    seed = choice_seed(request.sampling.seed, index) or 0
    h = zlib.crc32(msgspec.msgpack.encode([request.prompt_ids, seed, index]))
    length = 4 + h % 8
    ids = [3 + (h // 7 + 17 * i * (i + 3)) % (vocab_size - 3) for i in range(length)]
    return ScriptedReply(token_ids=ids)


def _forbidden(
    tok: int,
    done: list[int],
    s: SamplingParams,
    banned: set[int],
    bad_words: list[list[int]],
    stop_ids: set[int],
) -> str | None:
    """Why the sampling controls of `s` mask `tok` after the completion `done` (None: they do
    not); the grammar is checked apart, since its matcher advances on the token."""
    if tok in banned:
        return "logit_bias bans it"
    if s.allowed_token_ids is not None and tok not in s.allowed_token_ids:
        return "allowed_token_ids excludes it"
    if tok in stop_ids and len(done) < s.min_tokens:
        return f"min_tokens={s.min_tokens} masks stop tokens"
    for w in bad_words:
        if w[-1] == tok and len(w) - 1 <= len(done) and done[len(done) - len(w) + 1 :] == w[:-1]:
            return "it completes a bad word"
    return None


class _Running:
    """Bookkeeping of one in-flight request (per choice: tokens so far)."""

    def __init__(self, n: int) -> None:
        self.ids: list[list[int]] = [[] for _ in range(n)]
        self.lps: list[list[float]] = [[] for _ in range(n)]
        self.vers: list[list[int]] = [[] for _ in range(n)]
        self.finished: list[FinishReason | None] = [None] * n
        self.aborted = False


class ScriptedEngine:
    """Deterministic `InferenceEngine`: scripted token IDs, logprobs, finish reasons and delays.

    Args:
        replies: replies consumed in order, one per choice (a choice of an n>1 request takes the
            next one); when exhausted, `rule(request, choice_index, vocab_size)` decides.
        vocab_size: token IDs accepted in prompts are in [0, vocab_size).
        max_model_len: longest prompt + completion, tokens.
        token_delay_s: sleep before each token (lets tests abort or load weights mid-stream).
        eos_token_id: appended by the default rule when the request lists it as a stop ID.
        tokenizer: the `transformers` tokenizer of the token IDs; needed to enforce structured
            outputs (requests carrying one are refused without it).
    """

    def __init__(
        self,
        replies: Iterable[ScriptedReply] = (),
        *,
        rule: Callable[[GenerateRequest, int, int], ScriptedReply] = default_reply,
        vocab_size: int = 1024,
        max_model_len: int = 4096,
        token_delay_s: float = 0.0,
        eos_token_id: int | None = None,
        weight_version: int = 0,
        tokenizer: Any = None,
    ) -> None:
        self.tokenizer = tokenizer
        self._compiler: Any = None
        self.replies: deque[ScriptedReply] = deque(replies)
        self.rule = rule
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.token_delay_s = token_delay_s
        self.eos_token_id = eos_token_id
        self.weight_version = weight_version
        self.requests_seen: list[GenerateRequest] = []
        """Every accepted request, in order (tests check the exact prompt IDs the engine ran on)."""
        self._running: dict[str, _Running] = {}
        self._tombstones: dict[str, bool] = {}  # aborted before they arrived
        self._paused = False
        self._counts = Counters(
            "requests_total", "requests_aborted", "tokens_generated", "weight_loads"
        )

    def push(self, *replies: ScriptedReply) -> None:
        """Queue more scripted replies."""
        self.replies.extend(replies)

    def _reply(self, request: GenerateRequest, index: int) -> ScriptedReply:
        if self.replies:
            return self.replies.popleft()
        reply = self.rule(request, index, self.vocab_size)
        s = request.sampling
        if (
            reply.finish_reason is None
            and self.eos_token_id in s.stop_token_ids
            and len(reply.token_ids) >= s.min_tokens
        ):
            reply = ScriptedReply(token_ids=[*reply.token_ids, self.eos_token_id], logprobs=None)
        return reply

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[TokenDelta, None]:
        if self._paused:
            raise EngineUnavailableError(
                f"engine is paused; request {request.request_id!r} refused"
            )
        max_tokens = validate_request(
            request, vocab_size=self.vocab_size, max_model_len=self.max_model_len
        )
        n = request.sampling.n
        if self._tombstones.pop(request.request_id, False):
            for index in range(n):  # aborted before it arrived: 0 tokens (field case B20)
                self._counts["requests_aborted"] += 1
                yield TokenDelta(
                    index=index, token_ids=[], logprobs=[], versions=[], finish_reason="abort"
                )
            return
        state = _Running(n)
        self._running[request.request_id] = state
        self._counts["requests_total"] += 1
        self.requests_seen.append(request)
        stop_ids = set(request.sampling.stop_token_ids)
        s = request.sampling
        banned = {t for t, b in (s.logit_bias or {}).items() if b <= -100}
        bad_words = self._bad_words(s.bad_words)
        try:
            for index in range(n):
                reply = self._reply(request, index)
                matcher = None if s.structured is None else self._matcher(s.structured)
                lps = reply.logprobs or [-0.5 - 0.01 * i for i in range(len(reply.token_ids))]
                finish: FinishReason | None = None
                for tok, lp in zip(reply.token_ids, lps):
                    if len(state.ids[index]) >= max_tokens:
                        finish = "length"
                        break
                    if self.token_delay_s:
                        await anyio.sleep(self.token_delay_s)
                    if state.aborted:
                        break
                    why = _forbidden(tok, state.ids[index], s, banned, bad_words, stop_ids)
                    if why is None and matcher is not None and not matcher.accept_token(tok):
                        why = "the grammar forbids it"
                    if why is not None:
                        raise EngineError(
                            f"request {request.request_id!r}: scripted token {tok} at position "
                            f"{len(state.ids[index])} cannot be sampled: {why}"
                        )
                    state.ids[index].append(tok)
                    state.lps[index].append(lp)
                    state.vers[index].append(self.weight_version)
                    self._counts["tokens_generated"] += 1
                    k = s.top_logprobs
                    yield TokenDelta(
                        index=index,
                        token_ids=[tok],
                        logprobs=[lp],
                        versions=[self.weight_version],
                        top_ids=[[(tok + j) % self.vocab_size for j in range(k)]] if k else None,
                        top_logprobs=[[lp - j for j in range(k)]] if k else None,
                    )
                    if tok in stop_ids:
                        finish = "stop"
                        break
                if state.aborted:
                    finish = "abort"
                elif reply.finish_reason is not None:
                    finish = reply.finish_reason
                elif finish is None:
                    finish = "length" if len(state.ids[index]) >= max_tokens else "stop"
                state.finished[index] = finish
                yield TokenDelta(
                    index=index, token_ids=[], logprobs=[], versions=[], finish_reason=finish
                )
        finally:
            self._running.pop(request.request_id, None)

    def _bad_words(self, words: tuple[str, ...]) -> list[list[int]]:
        """The token sequences of `words` as vLLM bans them: each word (leading blanks
        stripped) as tokenized, and with a leading space when that gives as many tokens with
        another first token (`InvalidRequestError` without a tokenizer)."""
        if not words:
            return []
        if self.tokenizer is None:
            raise InvalidRequestError(
                "the scripted engine enforces bad_words only with a tokenizer "
                "(ScriptedEngine(tokenizer=...))"
            )
        out: list[list[int]] = []
        for word in words:
            plain = self.tokenizer.encode(word.lstrip(), add_special_tokens=False)
            spaced = self.tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
            if not plain:
                raise InvalidRequestError(f"bad word {word!r} tokenizes to no token")
            out.append(plain)
            if len(spaced) == len(plain) and spaced[0] != plain[0]:
                out.append(spaced)
        return out

    def _matcher(self, structured: StructuredOutput) -> Any:
        """A fresh xgrammar `GrammarMatcher` for `structured` over the engine's tokenizer
        (`InvalidRequestError` without a tokenizer, or for a spec xgrammar rejects)."""
        if self.tokenizer is None:
            raise InvalidRequestError(
                f"the scripted engine enforces a {structured.kind!r} constraint only with a "
                "tokenizer (ScriptedEngine(tokenizer=...))"
            )
        import xgrammar as xgr

        if self._compiler is None:
            info = xgr.TokenizerInfo.from_huggingface(
                self.tokenizer,
                vocab_size=self.vocab_size,
                stop_token_ids=None if self.eos_token_id is None else [self.eos_token_id],
            )
            self._compiler = xgr.GrammarCompiler(info)
        c = self._compiler
        try:
            # JSON compact, as `vllm_engine` compiles it (`disable_any_whitespace`)
            compact = dict(any_whitespace=False, separators=(",", ":"))
            if structured.kind == "json_schema":
                compiled = c.compile_json_schema(structured.spec, **compact)
            elif structured.kind == "json_object":
                compiled = c.compile_json_schema('{"type": "object"}', **compact)
            elif structured.kind == "regex":
                compiled = c.compile_regex(structured.spec)
            elif structured.kind == "grammar":
                compiled = c.compile_grammar(structured.spec)
            else:
                compiled = c.compile_structural_tag(structured.spec)
        except (RuntimeError, ValueError) as exc:
            raise InvalidRequestError(f"invalid {structured.kind} constraint: {exc}") from None
        return xgr.GrammarMatcher(compiled)

    async def abort(self, request_id: str) -> list[Completion]:
        state = self._running.get(request_id)
        if state is None:
            remember_abort(self._tombstones, request_id)
            return []
        state.aborted = True
        self._counts["requests_aborted"] += 1
        return [
            Completion(
                index=i,
                token_ids=list(state.ids[i]),
                logprobs=list(state.lps[i]),
                versions=list(state.vers[i]),
                finish_reason=state.finished[i] or "abort",
            )
            for i in range(len(state.ids))
        ]

    async def load_weights(self, snapshot: str, version: int) -> None:
        self.weight_version = version
        self._counts["weight_loads"] += 1

    async def pause(self) -> None:
        self._paused = True

    async def resume(self) -> None:
        self._paused = False

    def statistics(self) -> EngineStatistics:
        return EngineStatistics(
            weight_version=self.weight_version,
            running_requests=len(self._running),
            paused=self._paused,
            prefix_cache_resets=self._counts["weight_loads"],
            max_model_len=self.max_model_len,
            vocab_size=self.vocab_size,
            **self._counts,
        )
