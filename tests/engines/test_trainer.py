"""The DeepSpeed trainer: one step on packed trees equals plain torch AdamW on the same loss;
a non-finite micro-batch leaves the weights and the version unchanged; snapshots reload exactly."""

from __future__ import annotations

import copy
import math

import msgspec
import pytest
import torch

from gyre.config import RLConfig, TrainerConfig
from gyre.engines import Trainer
from gyre.rl import PolicyObjective, microbatch_loss
from gyre.trajectory.pack import pack_batch
from gyre.trajectory.select import select_trajectories
from gyre.trajectory.tree import build_tree
from tests.trajectory.builders import make_call

pytestmark = pytest.mark.slow  # DeepSpeed import and init: ~10 s

deepspeed = pytest.importorskip(
    "deepspeed", reason="DeepSpeed is not installed (pip install -e .[cpu])"
)


def batch_of_two(version: int = 0):
    e0 = [
        make_call(
            "e0", "c0", [5, 6, 7], [8, 9, 2], logprobs=[-6.9, -7.0, -6.8], versions=[version] * 3
        ),
        make_call(
            "e0",
            "c1",
            [5, 6, 7, 8, 9, 2, 11, 12],
            [13, 2],
            parent="c0",
            logprobs=[-7.1, -6.7],
            versions=[version] * 2,
        ),
    ]
    e1 = [
        make_call(
            "e1",
            "d0",
            [5, 6, 20],
            [21, 22, 23, 2],
            logprobs=[-6.5, -7.2, -6.9, -7.0],
            versions=[version] * 4,
        )
    ]
    items = [(t, select_trajectories(t, 4)) for t in (build_tree(e0), build_tree(e1))]
    return pack_batch(items, token_budget=12), {"e0": 1.0, "e1": -1.0}


def reference_backward(model, micro_batches, advantages, version: int) -> None:
    """The gradient of the default objective on `micro_batches`, accumulated in plain torch."""
    rl = RLConfig()
    for mb in micro_batches:
        loss, _ = microbatch_loss(
            model,
            mb,
            advantages,
            trainer_version=version,
            max_staleness=rl.max_staleness,
            clip_eps=rl.clip_eps,
            is_cap=rl.is_cap,
        )
        loss.backward()


@pytest.fixture(scope="module")
def trainer(tiny_model_dir):
    from gyre.engines.trainer import DeepSpeedTrainer

    # adam_eps 1e-4 (not the default 1e-8) moves parameters with small gradients visibly less:
    # the comparison with plain AdamW below fails if the setting does not reach the optimizer.
    config = TrainerConfig(learning_rate=1e-3, grad_clip=0.0, adam_eps=1e-4)
    return DeepSpeedTrainer(tiny_model_dir, config, PolicyObjective(RLConfig()))


def test_step_equals_plain_torch_adamw(trainer, tiny_model_dir) -> None:
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa"
    )
    reference.load_state_dict(trainer.model.state_dict())
    optimizer = torch.optim.AdamW(
        reference.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-4, weight_decay=0.0
    )
    micro_batches, advantages = batch_of_two(trainer.version)
    assert len(micro_batches) == 2  # two micro-batches accumulate into one step
    reference_backward(reference, micro_batches, advantages, trainer.version)
    optimizer.step()
    before = trainer.version
    assert isinstance(trainer, Trainer)
    counted = trainer.statistics()
    stats = trainer.train_batch(micro_batches, advantages)
    assert stats.applied and stats.version == before + 1 and stats.micro_batches == 2
    after = trainer.statistics()
    assert after.version == stats.version and not after.has_gradients
    assert (
        after.steps_applied == counted.steps_applied + 1
        and after.steps_skipped == counted.steps_skipped
    )
    assert (
        after.micro_batches == counted.micro_batches + 2
        and after.tokens == counted.tokens + stats.tokens
    )
    assert stats.policy_tokens == 9  # 3 + 2 + 4 completion tokens, each once
    assert math.isfinite(stats.loss) and stats.grad_norm is not None
    worst = max(
        (a - b).abs().max().item()
        for a, b in zip(trainer.model.parameters(), reference.parameters())
    )
    assert worst <= 1e-6


def test_non_finite_micro_batch_leaves_weights_unchanged(trainer) -> None:
    micro_batches, advantages = batch_of_two(trainer.version)
    poisoned = dict(
        advantages, e1=3e38
    )  # finite advantage, but ratio x advantage overflows float32: inf loss
    before = copy.deepcopy(trainer.model.state_dict())
    version = trainer.version
    skipped = trainer.statistics().steps_skipped
    stats = trainer.train_batch(micro_batches, poisoned)
    assert not stats.applied and stats.version == version == trainer.version
    assert trainer.statistics().steps_skipped == skipped + 1
    for name, tensor in trainer.model.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    assert trainer.train_batch(micro_batches, advantages).applied  # and the next batch trains


def test_snapshot_reloads_the_trained_weights(trainer, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    path = trainer.save_snapshot(tmp_path)
    assert path.name == f"v{trainer.version}"
    loaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    for name, tensor in trainer.model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_bad_batches_are_refused(trainer) -> None:
    with pytest.raises(ValueError, match="at least one micro-batch"):
        trainer.train_batch([], {})
    micro_batches, _ = batch_of_two(trainer.version)
    with pytest.raises(ValueError, match="no advantage"):
        trainer.train_batch(micro_batches, {"e0": 1.0})


@pytest.mark.parametrize("zero_stage", [0, 1, 2, 3])
def test_warmup_steps_scale_the_rate_and_resume_from_a_checkpoint(
    zero_stage, tiny_model_dir, tmp_path
):
    """`warmup_steps=3`: steps 1-3 use 1/3, 2/3 and 3/3 of the rate, as plain torch AdamW whose
    rate is set by hand; a trainer restored from a checkpoint after step 1 goes on at 2/3, and a
    skipped step does not count. At every ZeRO stage (DeepSpeed wraps the optimizer differently
    at each; the weights are read from a snapshot, whole at stage 3 too)."""
    from transformers import AutoModelForCausalLM

    from gyre.engines.trainer import DeepSpeedTrainer
    from tests.cell.test_roles import snapshot_state

    config = TrainerConfig(learning_rate=1e-3, grad_clip=0.0, warmup_steps=3, zero_stage=zero_stage)
    first = DeepSpeedTrainer(tiny_model_dir, config, PolicyObjective(RLConfig()))
    reference = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa"
    )
    optimizer = torch.optim.AdamW(reference.parameters(), betas=(0.9, 0.999), weight_decay=0.0)
    trainer = first
    for step, rate in enumerate((1e-3 / 3, 2e-3 / 3, 1e-3), start=1):
        micro_batches, advantages = batch_of_two(trainer.version)
        reference_backward(reference, micro_batches, advantages, trainer.version)
        for group in optimizer.param_groups:
            group["lr"] = rate
        optimizer.step()
        optimizer.zero_grad()
        if step == 2:  # a skipped step (its gradient overflows) does not move the warm-up on
            assert not trainer.train_batch(micro_batches, dict(advantages, e1=3e38)).applied
        assert trainer.train_batch(micro_batches, advantages).applied
        if step == 1:
            first.save_checkpoint(tmp_path / "checkpoint")
            trainer = DeepSpeedTrainer(tiny_model_dir, config, PolicyObjective(RLConfig()))
            trainer.load_checkpoint(tmp_path / "checkpoint")
            assert trainer.version == first.version
        state = snapshot_state(trainer.save_snapshot(tmp_path / f"snapshot-{step}"))
        worst = max(
            (state[name] - p.detach()).abs().max().item()
            for name, p in reference.named_parameters()
        )
        assert worst <= 1e-6, step
    with pytest.raises(ValueError, match="warmup_steps=-1"):
        TrainerConfig(warmup_steps=-1)
    with pytest.raises(ValueError, match="adam_eps=0"):
        TrainerConfig(adam_eps=0.0)


@pytest.mark.parametrize(
    "changed", [{"warmup_steps": 0}, {"warmup_steps": 5}, {"learning_rate": 2e-3}]
)
def test_a_resume_at_another_rate_or_warmup_is_refused(changed, tiny_model_dir, tmp_path):
    """The optimizer state restores the checkpoint's rate: a config that changed it is refused,
    not quietly ignored."""
    from gyre.engines.trainer import DeepSpeedTrainer

    saved = TrainerConfig(learning_rate=1e-3, grad_clip=0.0, warmup_steps=3)
    DeepSpeedTrainer(tiny_model_dir, saved, PolicyObjective(RLConfig())).save_checkpoint(tmp_path)
    config = msgspec.structs.replace(saved, **changed)
    resumed = DeepSpeedTrainer(tiny_model_dir, config, PolicyObjective(RLConfig()))
    with pytest.raises(ValueError, match=r"learning_rate=0.001 and trainer.warmup_steps=3"):
        resumed.load_checkpoint(tmp_path)
