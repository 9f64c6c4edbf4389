"""Behaviour logprobs recomputed with transformers: the reference for what an engine sampled from.

Owns `sampling_logprobs` (logits -> logprobs of the distribution an engine samples from: the
temperature, top-k and top-p of vLLM, docs/design.md invariant 2) and `completion_logprobs` (a
model, a prompt and a completion -> each completion token's behaviour logprob, one unpacked
forward, no gradient). Tests use it as the independent reference for vLLM's logprobs. Not what
the trainer trains on: that is `gyre.rl.packed_forward` (packed trees, differentiable, over the
fused `gyre.kernels.selective_logprob` kernel). Knows nothing about engines or trees.

Shapes: T = sequence positions, V = vocabulary, C = completion tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["sampling_logprobs", "completion_logprobs"]


def sampling_logprobs(
    logits_TV: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """Log-probabilities of the distribution sampled from: logits / T, then top-k, then top-p.

    This is vLLM's `processed_logprobs` order and rule (temperature, then top-k, then top-p as in
    vLLM's `apply_top_k_top_p_pytorch`: sorted ascending, tokens whose cumulative mass is
    <= 1 - top_p are dropped, the most likely always kept; then log-softmax over the kept tokens;
    field case B05: logits [2, 1, 0], T = 0.5 gives log softmax([4, 2, 0])[0] = -0.14293).
    Temperature 0 (greedy) uses the raw logits.

    Args:
        logits_TV: float logits, shape [T, V].
        temperature: >= 0.
        top_k: keep the k largest logits per row; 0 keeps all.
        top_p: keep the smallest set of most likely tokens whose mass reaches top_p; 1 keeps all.
    Returns:
        [T, V] logprobs in the logits' dtype; masked tokens are -inf.
    Raises:
        ValueError: temperature < 0, top_k < 0 or top_p outside (0, 1].
    """
    if temperature < 0 or top_k < 0 or not 0 < top_p <= 1:
        raise ValueError(f"{temperature=} must be >= 0, {top_k=} >= 0, {top_p=} in (0, 1]")
    x = logits_TV / temperature if temperature > 0 else logits_TV
    if top_k and top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1:  # ascending cumulative mass <= 1 - p is dropped; the top token always stays
        sorted_x, order = torch.sort(x, dim=-1, descending=False)
        drop_sorted = torch.softmax(sorted_x, dim=-1).cumsum(dim=-1) <= 1 - top_p
        drop_sorted[..., -1] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.log_softmax(x, dim=-1)


@torch.no_grad()
def completion_logprobs(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> torch.Tensor:
    """Logprob of each completion token given the prompt and the completion before it.

    Args:
        model: a transformers causal LM (its parameters' dtype is the compute dtype).
        prompt_ids: C_p >= 1 prompt token IDs.
        completion_ids: C token IDs sampled after the prompt.
    Returns:
        float tensor [C] (model dtype), natural-log probabilities under `sampling_logprobs`.
    Raises:
        ValueError: empty prompt.
    """
    if not prompt_ids:
        raise ValueError("prompt_ids must not be empty")
    if not completion_ids:
        return torch.empty(0)
    device = next(model.parameters()).device
    ids = torch.tensor([*prompt_ids, *completion_ids], device=device)[None]
    logits_TV = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1]
    lp_TV = sampling_logprobs(logits_TV, temperature=temperature, top_k=top_k, top_p=top_p)
    target_T = torch.tensor(list(completion_ids), device=device)
    return lp_TV.gather(-1, target_T[:, None])[:, 0]
