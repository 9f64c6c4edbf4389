"""A tiny seeded Qwen2ForCausalLM for trainer-side tests (built from a config, no files)."""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def tiny_qwen2(
    *,
    seed: int = 0,
    vocab: int = 32,
    hidden: int = 64,
    layers: int = 2,
    dtype: torch.dtype = torch.float64,
    attn: str = "sdpa",
) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        attn_implementation=attn,
    )
    model = Qwen2ForCausalLM(config).to(dtype)
    with torch.no_grad():  # the default init is tiny (std 0.02): make logits depend on context
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0.0, 0.3)
    return model.eval()


def path_logprobs(model, ids: list[int]) -> torch.Tensor:
    """Next-token logprobs [len(ids) - 1] of one sequence run alone (plain causal attention)."""
    x = torch.tensor([ids])
    logits = model(input_ids=x, use_cache=False).logits[0, :-1]
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return torch.log_softmax(logits.to(dtype), -1).gather(1, x[0, 1:, None]).squeeze(1)
