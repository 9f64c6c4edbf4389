"""The packed forward: the trainer's differentiable logprobs of a packed micro-batch.

Owns `packed_logprobs`, what the objective trains on: a Hugging Face causal LM's decoder run over
the packed tree chunk by chunk (`PackedBatch.chunk_start_C`, DFS order, tree position ids), each
chunk attending to its ancestors' cached K/V (`gyre.kernels.cached_tree_attention.TreeKVCache`,
through an attention function registered with transformers' `AttentionInterface` as
`gyre_tree`), then the fused selective logprob + entropy kernel
(`gyre.kernels.selective_logprob`) at the loss positions only, each predicted from its parent's
hidden state. No T x T mask is built; memory is linear in the tree's tokens and one backward over
the result is exact. Not the behaviour-logprob reference of `gyre.model.behaviour_logprobs` (one
unpacked sequence, no gradient). Knows nothing about rewards or optimizers; knows the Hugging Face
layout `model.model` (returns `last_hidden_state`, passes extra keyword arguments down to its
attention function) and `model.lm_head` (no bias), as Qwen2.
Shape suffix legend: `T` packed tokens, `N` loss positions, `H` hidden size, `V` vocabulary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np
import torch
from transformers import AttentionInterface, PreTrainedConfig

from gyre.errors import ContextLengthError
from gyre.kernels.cached_tree_attention import ChunkAttention, TreeKVCache
from gyre.kernels.selective_logprob import LogprobImpl, selective_logprob_entropy
from gyre.trajectory.pack import PackedBatch

__all__ = ["packed_logprobs", "check_context"]

_ATTENTION_NAME = "gyre_tree"
_MODEL_ATTENTION: dict[str, ChunkAttention] = {"sdpa": "sdpa", "flex_attention": "flex"}


class _AttentionLayer(Protocol):
    """What transformers passes as `module` to an attention function (Qwen2Attention, ...)."""

    layer_idx: int


def _tree_attention_forward(
    module: _AttentionLayer,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: object,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: q [1, H, Q, D], k/v [1, G, Q, D] -> ([1, Q, H, D], None)."""
    cache: TreeKVCache = kwargs["gyre_tree_cache"]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out_BHQD = cache.attend(module.layer_idx, query, key, value, scale)
    return out_BHQD.transpose(1, 2).contiguous(), None


AttentionInterface.register(_ATTENTION_NAME, _tree_attention_forward)


@contextlib.contextmanager
def _tree_attention(config: PreTrainedConfig) -> Iterator[None]:
    """The model's attention layers call `_tree_attention_forward` inside the block."""
    before = config._attn_implementation
    config._attn_implementation = _ATTENTION_NAME
    try:
        yield
    finally:
        config._attn_implementation = before


def _causal_lm(model: torch.nn.Module) -> tuple[PreTrainedConfig, torch.nn.Module, torch.Tensor]:
    """`model.config`, `model.model` (the decoder) and `model.lm_head.weight`: the Hugging Face
    layout this module knows. Raises `TypeError` for a model without it."""
    config = getattr(model, "config", None)
    decoder = getattr(model, "model", None)
    head_weight = getattr(getattr(model, "lm_head", None), "weight", None)
    if not (
        isinstance(config, PreTrainedConfig)
        and isinstance(decoder, torch.nn.Module)
        and isinstance(head_weight, torch.Tensor)
    ):
        raise TypeError(
            f"{type(model).__name__} is not a Hugging Face causal LM with `config`, `model` "
            "(the decoder) and `lm_head.weight`"
        )
    return config, decoder, head_weight


def check_context(model: torch.nn.Module, batch: PackedBatch) -> None:
    """Raise `ContextLengthError` (a `ValueError`, HTTP 400) naming the execution and the lengths
    when a root path of `batch` holds more tokens than the model's `max_position_embeddings`."""
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is None or batch.num_tokens == 0:
        return
    longest_E = np.zeros(len(batch.execution_ids), dtype=np.int64)
    np.maximum.at(longest_E, batch.execution_T, batch.position_ids_T + 1)
    over = np.flatnonzero(longest_E > limit)
    if over.size:
        e = int(over[0])
        raise ContextLengthError(
            f"execution {batch.execution_ids[e]!r} has a path of {int(longest_E[e])} tokens, "
            f"longer than the model's context (max_position_embeddings={limit})"
        )


def packed_logprobs(
    model: torch.nn.Module,
    batch: PackedBatch,
    *,
    positions_N: np.ndarray | None = None,
    temperature: float | None = None,
    chunk_size: int = 1024,
    impl: LogprobImpl = "torch",
    attention: ChunkAttention | None = None,
    query_block: int = 512,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprob_N, entropy_N) of the tokens at packed indices `positions_N` (int [N]; default: the
    loss positions), in nats, float32 (float64 for a float64 model), differentiable w.r.t. the
    model's parameters. `chunk_size` and `impl` go to `selective_logprob_entropy`.

    `attention`: `sdpa` (any device; query blocks of `query_block` rows, checkpointed) or `flex`
    (FlexAttention BlockMask per chunk; CUDA for training). None takes it from the model's
    `attn_implementation` ("sdpa" or "flex_attention"; `ValueError` otherwise, e.g. "eager").
    Each token is scored at the temperature its call sampled with (`batch.temperature_T`, B05),
    unless `temperature` overrides it for all. Raises `ValueError` for a position with no parent
    (a root token has nothing to predict it) or sampled greedily (temperature 0), and
    `ContextLengthError` for a path longer than the model's context (`check_context`).
    """
    config, decoder, head_weight = _causal_lm(model)
    if attention is None:
        attn = config._attn_implementation
        if attn not in _MODEL_ATTENTION:
            raise ValueError(
                f"attn_implementation={attn!r} is not supported for tree attention: use 'sdpa' "
                "or 'flex_attention' (or pass attention='sdpa' | 'flex'); 'eager' treats a "
                "boolean 4D mask as additive and is silently wrong"
            )
        attention = _MODEL_ATTENTION[attn]
    if positions_N is None:
        positions = batch.loss_positions()
    else:
        positions = np.asarray(positions_N, dtype=np.int64)
    parents = batch.parent_T[positions]
    if (parents < 0).any():
        raise ValueError(
            f"positions {positions[parents < 0].tolist()} are roots: no logits predict them"
        )
    if temperature is None:
        temps = batch.temperature_T[positions]
        bad = ~(temps > 0)
        if bad.any():
            raise ValueError(
                f"positions {positions[bad].tolist()[:8]} have temperature "
                f"{temps[bad].tolist()[:8]}: "
                "only tokens sampled at a temperature > 0 can be trained"
            )
    check_context(model, batch)
    device = head_weight.device
    cache = TreeKVCache(
        torch.as_tensor(batch.dfs_out_T, device=device),
        batch.chunk_start_C.tolist(),
        attention=attention,
        query_block=query_block,
    )
    input_ids_T = torch.as_tensor(batch.input_ids_T, device=device)
    position_ids_T = torch.as_tensor(batch.position_ids_T, device=device)
    no_mask = {"full_attention": None, "sliding_attention": None}
    hidden = []
    with _tree_attention(config):
        for c in range(len(cache.bounds)):
            lo, hi = cache.begin_chunk(c)
            out = decoder(
                input_ids=input_ids_T[None, lo:hi],
                position_ids=position_ids_T[None, lo:hi],
                attention_mask=no_mask,
                use_cache=False,
                gyre_tree_cache=cache,
            )
            hidden.append(out.last_hidden_state[0])
    hidden_TH = hidden[0] if len(hidden) == 1 else torch.cat(hidden)
    hidden_NH = hidden_TH[torch.as_tensor(parents, device=device)]
    labels_N = torch.as_tensor(batch.input_ids_T[positions], device=device)
    temp: torch.Tensor | float
    if temperature is None:
        temp = torch.as_tensor(batch.temperature_T[positions], device=device)
    else:
        temp = temperature
    return selective_logprob_entropy(
        hidden_NH,
        head_weight,
        labels_N,
        temperature=temp,
        chunk_size=chunk_size,
        impl=impl,
    )
