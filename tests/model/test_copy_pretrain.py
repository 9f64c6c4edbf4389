"""Copy pretraining (`gyre.model.copy_pretrain`): its data repeat each span, it teaches the tiny
model to copy, and the warm start runs it first when asked."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import torch
import torch.nn.functional as F

from gyre.config import ModelConfig, WarmStartConfig
from gyre.model.copy_pretrain import (
    COPY_BATCH,
    COPY_FILLER,
    COPY_SPAN,
    copy_batch,
    copy_pretrain,
)
from gyre.model.recipe import build_model
from gyre.model.sft import SFT_RECORD, SFTResult, warm_start


def test_a_batch_repeats_its_span_with_filler_between() -> None:
    ids = copy_batch(torch.Generator().manual_seed(0), 1024)
    s, f = COPY_SPAN, COPY_FILLER
    assert ids.shape == (COPY_BATCH, 3 * s + 2 * f) and ids.dtype == torch.int64
    span, fill = ids[:, :s], ids[:, s : s + f]
    assert torch.equal(ids[:, s + f : 2 * s + f], span)
    assert torch.equal(ids[:, 2 * s + f : 2 * s + 2 * f], fill.flip(1))
    assert torch.equal(ids[:, 2 * s + 2 * f :], span)
    assert int(ids.min()) >= 3 and int(ids.max()) < 1024 - 14
    assert torch.equal(copy_batch(torch.Generator().manual_seed(0), 1024), ids)
    assert not torch.equal(copy_batch(torch.Generator().manual_seed(1), 1024), ids)


def test_bad_steps_are_refused() -> None:
    with pytest.raises(ValueError, match="steps=0"):
        copy_pretrain(build_model(ModelConfig(), 1024), 0, seed=0)
    with pytest.raises(ValueError, match="vocab_size=16 leaves no token IDs"):
        copy_batch(torch.Generator(), 16)
    with pytest.raises(ValueError, match="copy_pretrain_steps=-1"):
        WarmStartConfig(copy_pretrain_steps=-1)


def _third_span_loss(model, seed: int) -> float:
    """Mean NLL (nats) of the third span's tokens after its first, which only copying predicts."""
    ids = copy_batch(torch.Generator().manual_seed(seed), 1024)
    start = 2 * COPY_SPAN + 2 * COPY_FILLER
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    return F.cross_entropy(
        logits[:, start : start + COPY_SPAN - 1].reshape(-1, logits.shape[-1]),
        ids[:, start + 1 : start + COPY_SPAN].reshape(-1),
    ).item()


@pytest.mark.slow
def test_the_tiny_model_learns_to_copy() -> None:
    model = build_model(ModelConfig(seed=0), 1024).train()
    before = _third_span_loss(model, seed=99)
    lines: list[str] = []
    losses = copy_pretrain(model, 400, seed=0, log=lines.append)
    after = _third_span_loss(model, seed=99)
    # a random model: about ln(1010) = 6.9 nats; a model that copies: near 0
    assert before > 6.0 and after < 0.5, (before, after)
    assert len(losses) == 400 and losses[-1] < losses[0]
    assert len(lines) == 10 and lines[-1].startswith("copy pretraining step 400/400")


@pytest.mark.slow
def test_the_warm_start_pretrains_first_and_records_it(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    settings = WarmStartConfig(examples=6, epochs=1, batch_size=3, copy_pretrain_steps=3)
    out = warm_start(tiny_model_dir, tmp_path / "out", settings)
    record = msgspec.json.decode((out / SFT_RECORD).read_bytes(), type=SFTResult)
    assert len(record.copy_pretrain_losses) == 3 and len(record.losses) == 2
    plain = warm_start(
        tiny_model_dir, tmp_path / "plain", msgspec.structs.replace(settings, copy_pretrain_steps=0)
    )
    assert (out / "model.safetensors").read_bytes() != (plain / "model.safetensors").read_bytes()
    assert (
        msgspec.json.decode((plain / SFT_RECORD).read_bytes(), type=SFTResult).copy_pretrain_losses
        == []
    )
