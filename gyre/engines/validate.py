"""Request validation shared by every engine backend, so all refuse bad input the same way.

Owns `validate_request` and `remember_abort`. Knows the engine's vocabulary size and context
limit, nothing else.
"""

from __future__ import annotations

import math

from gyre.engines.protocol import GenerateRequest
from gyre.errors import ContextLengthError, InvalidRequestError

__all__ = ["validate_request", "remember_abort", "MAX_TOMBSTONES"]

MAX_TOMBSTONES = 65536
"""Aborts of not-yet-arrived requests remembered per engine (oldest forgotten first)."""


def validate_request(request: GenerateRequest, *, vocab_size: int, max_model_len: int) -> int:
    """Check a request and return the max_tokens the engine will honour.

    The completion is clamped to fit: ``min(max_tokens, max_model_len - len(prompt))``; a choice
    that reaches the clamp ends with `length` (field case B15 (a)).

    Raises:
        ContextLengthError: the prompt alone needs all of max_model_len (no room for one token).
        InvalidRequestError: empty prompt, a token ID outside [0, vocab_size), max_tokens < 1,
            n < 1, temperature < 0, top_p outside (0, 1], top_k < 0, min_p outside [0, 1],
            min_tokens outside [0, max_tokens], a stop ID or allowed token ID out of vocabulary,
            an empty `allowed_token_ids` or bad word.
    """
    prompt = request.prompt_ids
    s = request.sampling
    if not prompt:
        raise InvalidRequestError(f"request {request.request_id!r}: prompt_ids is empty")
    try:
        in_range = 0 <= min(prompt) and max(prompt) < vocab_size  # C speed on 700K-token prompts
    except TypeError:
        in_range = False
    bad = (
        None
        if in_range
        else next((t for t in prompt if not (isinstance(t, int) and 0 <= t < vocab_size)), None)
    )
    if bad is not None:
        raise InvalidRequestError(
            f"request {request.request_id!r}: prompt token ID {bad!r} outside [0, {vocab_size})"
        )
    if len(prompt) >= max_model_len:
        raise ContextLengthError(
            f"request {request.request_id!r}: prompt of {len(prompt)} tokens leaves no room in "
            f"max_model_len={max_model_len}"
        )
    if s.max_tokens < 1:
        raise InvalidRequestError(
            f"request {request.request_id!r}: max_tokens={s.max_tokens} must be >= 1"
        )
    if s.n < 1:
        raise InvalidRequestError(f"request {request.request_id!r}: n={s.n} must be >= 1")
    if not (math.isfinite(s.temperature) and s.temperature >= 0):
        raise InvalidRequestError(
            f"request {request.request_id!r}: temperature={s.temperature} must be >= 0"
        )
    if not (0 < s.top_p <= 1):
        raise InvalidRequestError(
            f"request {request.request_id!r}: top_p={s.top_p} must be in (0, 1]"
        )
    if s.top_k < 0:
        raise InvalidRequestError(f"request {request.request_id!r}: top_k={s.top_k} must be >= 0")
    if not (math.isfinite(s.min_p) and 0 <= s.min_p <= 1):
        raise InvalidRequestError(
            f"request {request.request_id!r}: min_p={s.min_p} must be in [0, 1]"
        )
    if not 0 <= s.min_tokens <= s.max_tokens:
        raise InvalidRequestError(
            f"request {request.request_id!r}: min_tokens={s.min_tokens} must be in "
            f"[0, max_tokens={s.max_tokens}]"
        )
    for what, ids in (("stop", s.stop_token_ids), ("allowed", s.allowed_token_ids or ())):
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(
                f"request {request.request_id!r}: {what} token ID {bad} outside [0, {vocab_size})"
            )
    if s.allowed_token_ids == () or any(not w for w in s.bad_words):
        raise InvalidRequestError(
            f"request {request.request_id!r}: allowed_token_ids and bad words must not be empty"
        )
    return min(s.max_tokens, max_model_len - len(prompt))


def remember_abort(tombstones: dict[str, bool], request_id: str) -> None:
    """Record an abort that arrived before its request, so the request ends at once with 0 tokens.

    A router may abort a request whose generate call is still in flight to the engine; without
    this the request would start after its abort and run to the end.
    """
    tombstones[request_id] = True
    while len(tombstones) > MAX_TOMBSTONES:
        del tombstones[next(iter(tombstones))]
