"""The packed forward: the trainer's differentiable logprobs of a packed micro-batch.

Owns `packed_logprobs`, what the objective trains on: one forward of a Hugging Face causal LM's
decoder over the packed tree (tree mask, tree position ids), then the fused selective logprob +
entropy kernel (`gyre.kernels.selective_logprob`) at the loss positions only, each predicted from
its parent's hidden state. Not the behaviour-logprob reference of `gyre.model.behaviour_logprobs`
(one unpacked sequence, no gradient). Knows nothing about rewards or optimizers; knows the Hugging
Face layout `model.model` (returns `last_hidden_state`) and `model.lm_head` (no bias), as Qwen2.
Shape suffix legend: `T` packed tokens, `N` loss positions, `H` hidden size, `V` vocabulary.
"""

from __future__ import annotations

import numpy as np
import torch

from gyre.kernels.selective_logprob import LogprobImpl, selective_logprob_entropy
from gyre.kernels.tree_attention import model_attention_mask
from gyre.trajectory.pack import PackedBatch

__all__ = ["packed_logprobs"]


def packed_logprobs(
    model: torch.nn.Module,
    batch: PackedBatch,
    *,
    positions_N: np.ndarray | None = None,
    temperature: float | None = None,
    chunk_size: int = 1024,
    impl: LogprobImpl = "torch",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprob_N, entropy_N) of the tokens at packed indices `positions_N` (int [N]; default: the
    loss positions), in nats, float32 (float64 for a float64 model), differentiable w.r.t. the
    model's parameters. `chunk_size` and `impl` go to `selective_logprob_entropy`.

    The model must use `attn_implementation` "sdpa" or "flex_attention" (`ValueError` otherwise:
    eager attention mishandles boolean 4D masks). Each token is scored at the temperature its
    call sampled with (`batch.temperature_T`, B05), unless `temperature` overrides it for all.
    Raises `ValueError` for a position with no parent (a root token has nothing to predict it)
    or a position sampled greedily (temperature 0: no distribution to train).
    """
    if positions_N is None:
        positions = batch.loss_positions()
    else:
        positions = np.asarray(positions_N, dtype=np.int64)
    parents = batch.parent_T[positions]
    if (parents < 0).any():
        raise ValueError(
            f"positions {positions[parents < 0].tolist()} are roots: no logits predict them"
        )
    device = model.lm_head.weight.device
    attn = model.config._attn_implementation
    dfs_out_T = torch.as_tensor(batch.dfs_out_T, device=device)
    mask = model_attention_mask(dfs_out_T, attn)
    input_ids = torch.as_tensor(batch.input_ids_T, device=device)[None]
    position_ids = torch.as_tensor(batch.position_ids_T, device=device)[None]
    hidden_TH = model.model(
        input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=False
    ).last_hidden_state[0]
    hidden_NH = hidden_TH[torch.as_tensor(parents, device=device)]
    labels_N = torch.as_tensor(batch.input_ids_T[positions], device=device)
    if temperature is None:
        temps = batch.temperature_T[positions]
        bad = ~(temps > 0)
        if bad.any():
            raise ValueError(
                f"positions {positions[bad].tolist()[:8]} have temperature "
                f"{temps[bad].tolist()[:8]}: "
                "only tokens sampled at a temperature > 0 can be trained"
            )
        temp = torch.as_tensor(temps, device=device)
    else:
        temp = temperature
    return selective_logprob_entropy(
        hidden_NH,
        model.lm_head.weight,
        labels_N,
        temperature=temp,
        chunk_size=chunk_size,
        impl=impl,
    )
