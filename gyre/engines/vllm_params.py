"""gyre's engine settings and sampling parameters in vLLM's terms.

Owns `engine_args` (vLLM's `AsyncEngineArgs` for a rollout engine: processed logprobs, xgrammar
structured outputs compiled compact, no chunked prefill on CPU, the KV transport's keywords),
`sampling_params` (one choice's `SamplingParams` as vLLM takes it: token IDs out, EOS not special,
deltas, flat logprobs), `structured_outputs`, `sampled_logprobs` and `top_entries` (vLLM's
per-position logprobs to the sampled token's and to top-k lists).
Knows nothing about requests in flight, weight loads or HTTP: `gyre.engines.vllm_engine` drives
the engine with these.
"""

from __future__ import annotations

import math
from typing import Any

from gyre.config import EngineConfig
from gyre.engines.kv_transport import kv_transport
from gyre.engines.protocol import SamplingParams, StructuredOutput
from gyre.errors import EngineError

__all__ = [
    "on_cpu",
    "engine_args",
    "sampling_params",
    "structured_outputs",
    "sampled_logprobs",
    "top_entries",
]


def on_cpu() -> bool:
    """Whether vLLM runs on its CPU backend here."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def engine_args(model_path: str, config: EngineConfig, *, tensor_parallel_size: int = 1) -> Any:
    """vLLM `AsyncEngineArgs` for a gyre rollout engine (token IDs in, processed logprobs out),
    tensor-parallel over `tensor_parallel_size` devices (a cell's `cells.devices_per_cell` on
    GPU; vLLM's CPU backend runs 1 here)."""
    from vllm.config import StructuredOutputsConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    kv = kv_transport(config).engine_args()
    if on_cpu():
        # No chunked prefill on CPU: a seeded request whose uncached prompt spans two prefill
        # chunks makes vLLM rewind its random generator, which a CPU generator refuses ("CPU
        # Generator does not use offset"), and the engine core dies (found by the long-context
        # benchmark). One chunk holds any prompt: max_num_batched_tokens >= max_model_len.
        kv.setdefault("max_num_batched_tokens", max(config.max_model_len, 2048))
    return AsyncEngineArgs(
        model=model_path,
        dtype=config.dtype,
        max_model_len=config.max_model_len,
        kv_cache_memory_bytes=config.kv_cache_memory_bytes,
        block_size=config.block_size,
        enable_prefix_caching=config.enable_prefix_caching,
        enforce_eager=config.enforce_eager,
        enable_sleep_mode=config.sleep_mode,
        tensor_parallel_size=tensor_parallel_size,
        logprobs_mode="processed_logprobs",
        max_logprobs=20,
        skip_tokenizer_init=False,  # structured outputs compile grammars over the vocabulary
        # xgrammar (structural tags need it); JSON constraints compile compact: with any
        # whitespace allowed, an untrained policy can spend max_tokens on whitespace in `{`.
        structured_outputs_config=StructuredOutputsConfig(
            backend="xgrammar", disable_any_whitespace=True
        ),
        seed=0,
        disable_log_stats=True,
        stream_interval=config.stream_interval,
        **kv,
    )


def sampling_params(
    s: SamplingParams, *, max_tokens: int, seed: int | None, kv_transfer: Any = None
) -> Any:
    """vLLM's `SamplingParams` for one choice of a gyre request (`n=1`: each choice is its own
    vLLM request with its own `seed`): `max_tokens` left to sample, token IDs only (no
    detokenizing), EOS not special (`ignore_eos`; `s.stop_token_ids` decide), `s.top_logprobs`
    top entries, the penalties, bias, structured output, min-p, min-tokens, allowed tokens and bad
    words of `s`, deltas out;
    `kv_transfer`: the KV connector's parameters of an import (None: none)."""
    from vllm.sampling_params import RequestOutputKind
    from vllm.sampling_params import SamplingParams as VSamplingParams

    return VSamplingParams(
        n=1,
        max_tokens=max_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        min_p=s.min_p,
        seed=seed,
        stop_token_ids=list(s.stop_token_ids),
        ignore_eos=True,
        logprobs=s.top_logprobs,
        flat_logprobs=True,  # flat lists, not a dict and a `Logprob` per token: `sampled_logprobs`
        logit_bias=s.logit_bias,
        presence_penalty=s.presence_penalty,
        frequency_penalty=s.frequency_penalty,
        repetition_penalty=s.repetition_penalty,
        structured_outputs=structured_outputs(s.structured),
        min_tokens=s.min_tokens,
        allowed_token_ids=None if s.allowed_token_ids is None else list(s.allowed_token_ids),
        bad_words=list(s.bad_words) or None,
        detokenize=False,
        skip_special_tokens=False,
        output_kind=RequestOutputKind.DELTA,
        extra_args={"kv_transfer_params": kv_transfer} if kv_transfer else None,
    )


def structured_outputs(c: StructuredOutput | None) -> Any:
    """vLLM's `StructuredOutputsParams` for a gyre constraint (None for none)."""
    if c is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    if c.kind == "json_schema":
        return StructuredOutputsParams(json=c.spec)
    if c.kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if c.kind == "regex":
        return StructuredOutputsParams(regex=c.spec)
    if c.kind == "grammar":
        return StructuredOutputsParams(grammar=c.spec)
    return StructuredOutputsParams(structural_tag=c.spec)


def sampled_logprobs(positions: Any, token_ids: list[int]) -> list[float]:
    """The logprob of the sampled token at each position of `positions` (vLLM's `FlatLogprobs` of
    the positions of `token_ids`, one per token: vLLM's sampler puts the sampled token first at
    each position). Raises `EngineError` if the positions do not hold `token_ids` there."""
    first = positions.start_indices
    if len(first) != len(token_ids) or [positions.token_ids[i] for i in first] != token_ids:
        raise EngineError(
            f"vLLM's logprobs do not match the sampled tokens {token_ids[:8]}... "
            f"({len(first)} positions for {len(token_ids)} tokens)"
        )
    return [positions.logprobs[i] for i in first]


def top_entries(positions: Any, count: int, k: int) -> tuple[list[list[int]], list[list[float]]]:
    """The k most likely tokens of each of the last `count` positions of vLLM's logprobs (a list or
    `FlatLogprobs`, either giving a `{token_id: Logprob(logprob, rank)}` per position, holding the
    top k and the sampled token), by rank; tokens the constraint masked (logprob -inf) are left
    out."""
    ids: list[list[int]] = []
    lps: list[list[float]] = []
    for pos in positions[len(positions) - count :]:
        ranked = sorted(
            ((lp.rank, tok, lp.logprob) for tok, lp in pos.items() if lp.logprob > -math.inf),
            key=lambda r: (r[0], r[1]),
        )[:k]
        ids.append([tok for _, tok, _ in ranked])
        lps.append([lp for _, _, lp in ranked])
    return ids, lps
