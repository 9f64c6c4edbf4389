"""Copy pretraining: teach a freshly initialised model to copy earlier tokens (induction heads)
before the warm start's demonstrations.

Owns `copy_pretrain` and its data (`copy_batch`). A real base model arrives able to copy what its
context says; the reference tiny model (`gyre.model.recipe`) is random, and the `learnable-long`
chains ask it to copy a word from a tool result. Trained on the chains alone it never learned to
(2,000 steps); after this phase 2,000 chain steps taught it in 1 of 4 tries (`gyre.model.sft`).
The data are spans of random tokens, each repeated, so the only way to lower the loss on a repeat
is to look back and copy: the mechanism of Olsson et al., "In-context Learning and Induction
Heads" (2022), section 2. Knows nothing about tasks, agents or engines.

Shape suffix legend: `B` sequences per batch, `S` tokens per sequence, `V` vocabulary.
"""

from __future__ import annotations

from typing import Any

__all__ = ["COPY_BATCH", "COPY_FILLER", "COPY_LR", "COPY_SPAN", "copy_batch", "copy_pretrain"]

COPY_BATCH = 32
"""Sequences per step."""
COPY_SPAN = 24
"""Random tokens per span; a sequence is span, filler, span, reversed filler, span (88 tokens)."""
COPY_FILLER = 8
"""Random tokens between repeats, so a repeat does not start where the previous one ended."""
COPY_LR = 1e-3
"""Peak AdamW learning rate (50-step linear warm-up, then constant). Measured on the tiny model
(2026-12-04, 2 layers x 128): the loss on repeated tokens falls from 6.9 nats to its floor (the
unpredictable filler) between steps 200 and 400, about 30 s on 2 cores."""
_WARMUP = 50


def copy_batch(generator: Any, vocab_size: int, low: int = 3):
    """One batch of copy sequences: int64 tensor [COPY_BATCH, 3 * COPY_SPAN + 2 * COPY_FILLER]
    of token IDs in [low, vocab_size - 14) (`low` skips the control tokens at the start of the
    reference vocabulary; the top 14 hold its 6 tag tokens and its rarest merges), drawn from
    `generator` (a `torch.Generator`).

    Raises:
        ValueError: the range [low, vocab_size - 14) holds fewer than 2 token IDs.
    """
    import torch

    high = vocab_size - 14
    if high - low < 2:
        raise ValueError(f"vocab_size={vocab_size} leaves no token IDs in [{low}, {high})")
    span_BS = torch.randint(low, high, (COPY_BATCH, COPY_SPAN), generator=generator)
    fill_BS = torch.randint(low, high, (COPY_BATCH, COPY_FILLER), generator=generator)
    return torch.cat([span_BS, fill_BS, span_BS, fill_BS.flip(1), span_BS], 1)


def copy_pretrain(model: Any, steps: int, *, seed: int, log=None) -> list[float]:
    """Train `model` (a transformers causal LM in float32, train mode) for `steps` AdamW steps on
    `copy_batch` data with loss on every next token; returns the mean loss per step (nats/token).

    Deterministic for equal model, seed and thread count. Gradients clipped to norm 1.0; the
    optimizer is dropped afterwards (the warm start makes its own). `log`: optional
    `callable(str)`, about ten lines.

    Raises:
        ValueError: steps < 1, or a vocabulary too small for `copy_batch`.
    """
    import torch
    import torch.nn.functional as F

    if steps < 1:
        raise ValueError(f"steps={steps} must be >= 1")
    generator = torch.Generator().manual_seed(seed)
    vocab_size = model.config.vocab_size
    opt = torch.optim.AdamW(model.parameters(), lr=COPY_LR, weight_decay=0.0)
    losses: list[float] = []
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = COPY_LR * min(1.0, (step + 1) / _WARMUP)
        ids_BS = copy_batch(generator, vocab_size)
        logits_BSV = model(input_ids=ids_BS, use_cache=False).logits[:, :-1]
        loss = F.cross_entropy(
            logits_BSV.reshape(-1, logits_BSV.shape[-1]), ids_BS[:, 1:].reshape(-1)
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if log is not None and ((step + 1) % max(steps // 10, 1) == 0 or step + 1 == steps):
            log(f"copy pretraining step {step + 1}/{steps} loss {losses[-1]:.3f}")
    return losses
