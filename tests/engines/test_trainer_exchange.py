"""The trainer's split step at ZeRO 0, 1 and 2: gradients read out with `gradient_vector` and
added back with `add_gradient_vector` equal plain torch autograd, and the step on them equals
plain torch AdamW on the whole batch; `load_weights` reloads a snapshot exactly."""

from __future__ import annotations

import pytest
import torch

from gyre.config import RLConfig, TrainerConfig
from gyre.rl import PolicyObjective, microbatch_loss
from tests.cell.test_roles import batch_of_three

pytestmark = pytest.mark.slow  # DeepSpeed init per stage: ~5-10 s each

deepspeed = pytest.importorskip(
    "deepspeed", reason="DeepSpeed is not installed (pip install -e .[cpu])"
)


def torch_reference(model_dir, micro_batches, advantages, rl: RLConfig):
    """Plain transformers + torch autograd: per-micro-batch flat gradients and the model."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="sdpa"
    )
    grads = []
    for mb in micro_batches:
        model.zero_grad()
        loss, _ = microbatch_loss(
            model,
            mb,
            advantages,
            trainer_version=0,
            max_staleness=rl.max_staleness,
            clip_eps=rl.clip_eps,
            is_cap=rl.is_cap,
        )
        loss.backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    return model, grads


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_gradient_vectors_add_up_to_one_trainers_step(stage, tiny_model_dir) -> None:
    from gyre.engines.trainer import DeepSpeedTrainer

    rl = RLConfig()
    micro_batches, advantages = batch_of_three(0)
    reference, grads = torch_reference(tiny_model_dir, micro_batches, advantages, rl)
    trainer = DeepSpeedTrainer(
        tiny_model_dir,
        TrainerConfig(learning_rate=1e-3, grad_clip=0.0, zero_stage=stage),
        PolicyObjective(rl),
    )
    assert not trainer.has_gradients
    assert torch.equal(
        trainer.gradient_vector(), torch.zeros(trainer.num_parameters)
    )  # nothing accumulated

    sent = []
    for mb, grad in zip(
        micro_batches[1:], grads[1:]
    ):  # two "satellites" (here: the same trainer in turn)
        stats = trainer.accumulate([mb], advantages)
        assert stats.micro_batches == 1 and stats.finite and trainer.has_gradients
        vec = trainer.gradient_vector()
        assert vec.dtype == torch.float32 and vec.shape == (trainer.num_parameters,)
        assert (vec - grad).abs().max().item() <= 1e-6 * grad.abs().max().item()
        assert torch.equal(trainer.gradient_vector(), vec)  # read again (a retried send): the same
        sent.append(vec)
        trainer.zero_grad()
        assert not trainer.has_gradients
    trainer.accumulate(micro_batches[:1], advantages)  # the "core"
    for vec in sent:
        trainer.add_gradient_vector(vec)
    assert trainer.statistics().gradient_vectors_added == 2
    with pytest.raises(ValueError, match="expected a float vector of"):
        trainer.add_gradient_vector(torch.zeros(3))
    step = trainer.apply_step()
    assert step.applied and step.version == 1 and not trainer.has_gradients

    optimizer = torch.optim.AdamW(
        reference.parameters(), lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0
    )
    offset = 0
    total = grads[0] + grads[1] + grads[2]
    for p in reference.parameters():
        p.grad = total[offset : offset + p.numel()].view_as(p).clone()
        offset += p.numel()
    optimizer.step()
    worst = max(
        (a - b).abs().max().item()
        for a, b in zip(trainer.model.parameters(), reference.parameters())
    )
    assert worst <= 1e-6


def test_load_weights_takes_a_snapshot_and_refuses_while_holding_gradients(
    tiny_model_dir, tmp_path
) -> None:
    from gyre.engines.trainer import DeepSpeedTrainer

    rl = RLConfig()
    config = TrainerConfig(learning_rate=1e-3, grad_clip=0.0, zero_stage=0)
    core = DeepSpeedTrainer(tiny_model_dir, config, PolicyObjective(rl))
    satellite = DeepSpeedTrainer(tiny_model_dir, config, PolicyObjective(rl))
    micro_batches, advantages = batch_of_three(0)
    core.train_batch(micro_batches, advantages)
    snapshot = core.save_snapshot(tmp_path)
    satellite.accumulate(micro_batches[:1], advantages)
    with pytest.raises(ValueError, match="while gradients are held"):
        satellite.load_weights(snapshot, core.version)
    satellite.zero_grad()
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        satellite.load_weights(tmp_path / "nowhere", 5)
    satellite.load_weights(snapshot, core.version)
    assert satellite.version == core.version == 1
    for a, b in zip(satellite.model.parameters(), core.model.parameters()):
        assert torch.equal(a, b)
