"""The trainer seam without DeepSpeed: the step guard (a non-finite loss on one micro-batch leaves
weights and optimizer unchanged), `DeepSpeedTrainer` against the `Trainer` protocol, and
`PolicyObjective` as `microbatch_loss` with its config's settings."""

from __future__ import annotations

import inspect

import torch

from gyre.config import RLConfig
from gyre.engines import Trainer
from gyre.engines.trainer import DeepSpeedTrainer, step_if_finite
from gyre.rl import PolicyObjective, microbatch_loss
from gyre.trajectory import build_tree, pack_batch, select_trajectories
from tests.rl.models import path_logprobs, tiny_qwen2
from tests.trajectory.builders import make_call


def _batches(model):
    """Two one-call executions, one per micro-batch, with on-policy behaviour logprobs (ratio 1)."""
    trees = []
    for i in range(2):
        prompt, completion = [1, 2, 3 + i], [4, 5, 6]
        with torch.no_grad():
            lps = path_logprobs(model, prompt + completion)[-3:].tolist()
        call = make_call(f"e{i}", "a", prompt, completion, logprobs=lps, versions=[1, 1, 1])
        trees.append(build_tree([call]))
    return pack_batch([(t, select_trajectories(t, 1)) for t in trees], token_budget=6)


def test_non_finite_micro_batch_skips_the_step_and_keeps_weights():
    model = tiny_qwen2(seed=3, vocab=16, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    first, second = _batches(model)
    advantages = {"e0": 1.0, "e1": -1.0}
    loss, _ = microbatch_loss(model, first, advantages, trainer_version=1, max_staleness=1)
    loss.backward()
    loss, _ = microbatch_loss(model, second, advantages, trainer_version=1, max_staleness=1)
    (loss * torch.tensor(float("nan"))).backward()  # one micro-batch whose loss is NaN
    assert any(not torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert step_if_finite(optimizer) is False
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n
        assert p.grad is None
    assert optimizer.state == {} or all(not s for s in optimizer.state.values())
    # The next, finite batch steps normally.
    for batch in (first, second):
        loss, _ = microbatch_loss(model, batch, advantages, trainer_version=1, max_staleness=1)
        loss.backward()
    assert step_if_finite(optimizer) is True
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_deepspeed_trainer_has_every_member_of_the_trainer_protocol():
    """Checked on the class (a `DeepSpeedTrainer` needs DeepSpeed; the slow tests check
    `isinstance` on a real one): every protocol method exists with the same parameters."""
    members = [n for n in vars(Trainer) if not n.startswith("_")]
    assert {"accumulate", "apply_step", "train_batch", "save_checkpoint", "statistics"} <= set(
        members
    )
    for name in members:
        ours, theirs = getattr(DeepSpeedTrainer, name), getattr(Trainer, name)
        if isinstance(theirs, property):
            assert isinstance(ours, property), name
        elif callable(theirs):
            assert list(inspect.signature(ours).parameters) == list(
                inspect.signature(theirs).parameters
            ), name
    assert "version" in Trainer.__annotations__


def test_policy_objective_is_microbatch_loss_with_the_config():
    model = tiny_qwen2(seed=3, vocab=16, dtype=torch.float64)
    first, _ = _batches(model)
    rl = RLConfig(clip_eps=0.1, is_cap=1.5, max_staleness=0, logprob_chunk_size=2)
    advantages = {"e0": 0.7, "e1": -1.0}
    loss, stats = PolicyObjective(rl)(model, first, advantages, version=1)
    ref, ref_stats = microbatch_loss(
        model,
        first,
        advantages,
        trainer_version=1,
        max_staleness=0,
        clip_eps=0.1,
        is_cap=1.5,
        chunk_size=2,
    )
    assert torch.equal(loss, ref) and stats == ref_stats and stats.tokens == 3
    _, stale = PolicyObjective(rl)(
        model, first, advantages, version=2
    )  # tokens of version 1 are 1 old
    assert stale.tokens == 0
