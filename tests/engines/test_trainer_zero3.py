"""A 2-rank ZeRO-3 trainer over gloo equals a 1-rank trainer on the same batch.

Two processes form one group of 2 ranks (a cell of 2 devices, as `gyre.cell.ranks`
hosts it) and train `batch_of_three` split between them: rank 0 takes micro-batches 0 and 2,
rank 1 takes micro-batch 1 plus a zero pass. Checked against a 1-rank ZeRO-0 trainer in this
process that trains the whole batch (fp32: 1e-5 relative, over two steps, Adam state included):
- each rank's `gradient_shard` is its partition (`ceil(n / 2)` elements of each parameter, the
  last one zero-padded) of the reference's whole gradient;
- a shard read out and added back (`add_gradient_shard` into an empty accumulation: what a
  core's rank receives) steps to the reference's weights;
- each rank holds half of the optimizer state: 2 x its shard, and its shards sum to P (+ pad).
Without gradient clipping: the clip factor comes from each stage's own global norm, and
the fp32 norm of this batch's gradient (4.48062, as torch sums it) is not its exact norm
(4.48101, in fp64, which ZeRO-3 reports); Adam's second step turns that 9e-5 into 5e-4 of the
near-zero bias tensors (measured), which is the norm's rounding, not the sharding under test.
float64 is refused at ZeRO-3 with a clear error: DeepSpeed's ZeRO-3 asserts half, bfloat16 or
float32 (`deepspeed/runtime/zero/partition_parameters.py`), so the fp64 1e-9 check of issue 19
is not reachable on DeepSpeed; fp64 exactness stays on the one-rank ZeRO-0 trainer.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import socket
from pathlib import Path

import pytest
import torch

from gyre.config import RLConfig, TrainerConfig
from gyre.rl import PolicyObjective
from tests.cell.test_roles import assert_close, batch_of_three, snapshot_state

pytestmark = pytest.mark.slow  # two DeepSpeed ZeRO-3 ranks in processes: ~20-40 s on 2 cores

deepspeed = pytest.importorskip(
    "deepspeed", reason="DeepSpeed is not installed (pip install -e .[cpu])"
)

ZERO3 = TrainerConfig(learning_rate=1e-3, grad_clip=0.0, zero_stage=3)
REFERENCE = TrainerConfig(learning_rate=1e-3, grad_clip=0.0, zero_stage=0)
RL = RLConfig()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank: int, port: int, model_dir: str, out: str) -> None:
    """One rank of the 2-rank group: two steps on its share of the batch; writes its shards,
    its sizes and (rank 0) the snapshot after each step under `out`."""
    from gyre.engines.trainer import DeepSpeedTrainer, init_process_group

    init_process_group(rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{port}")
    trainer = DeepSpeedTrainer(model_dir, ZERO3, PolicyObjective(RL))
    out_dir = Path(out)
    sizes = {}
    for step in range(2):
        micro_batches, advantages = batch_of_three(trainer.version)
        mine = micro_batches[rank::2]
        stats = trainer.accumulate(mine, advantages, passes=2)
        assert stats.micro_batches == len(mine)
        shard = trainer.gradient_shard()
        # on the parameters' device (CPU here; `cuda:<rank>` on a GPU cell), whole or in shards
        device = trainer.engine.module.lm_head.weight.device
        assert shard.device == trainer.device == device
        assert trainer.gradient_vector().device == device  # an all-gather of the shards
        torch.save(shard, out_dir / f"shard-{step}-rank{rank}.pt")
        if step == 0:  # out and back in: what a core's rank receives into an empty accumulation
            trainer.zero_grad()
            assert not trainer.has_gradients
            assert torch.equal(trainer.gradient_shard(), torch.zeros_like(shard))
            trainer.add_gradient_shard(shard)
            assert torch.equal(trainer.gradient_shard(), shard)
        result = trainer.apply_step()
        assert result.applied and result.version == step + 1
        trainer.save_snapshot(out_dir / f"snapshots-{step}")
        sizes = dict(
            shard_numel=trainer.shard_numel,
            num_parameters=trainer.num_parameters,
            optimizer_state_numel=trainer.optimizer_state_numel(),
            policy_tokens=stats.policy_tokens,
            loss=stats.loss,
        )
        (out_dir / f"sizes-{step}-rank{rank}.json").write_text(json.dumps(sizes))


def run_ranks(model_dir: Path, out: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    port = _free_port()
    procs = [
        ctx.Process(target=rank_main, args=(rank, port, str(model_dir), str(out)))
        for rank in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
    assert [p.exitcode for p in procs] == [0, 0]


def partition(vec: torch.Tensor, model, rank: int) -> torch.Tensor:
    """Rank `rank`'s ZeRO-3 partition of a whole flat gradient: of each parameter, elements
    [rank * ceil(n/2), (rank + 1) * ceil(n/2)), zero-padded."""
    parts, offset = [], 0
    for p in model.parameters():
        n = p.numel()
        part = math.ceil(n / 2)
        piece = vec[offset : offset + n][rank * part : (rank + 1) * part]
        parts.append(torch.nn.functional.pad(piece, (0, part - piece.numel())))
        offset += n
    return torch.cat(parts)


def test_two_rank_zero3_equals_one_rank_trainer(tiny_model_dir, tmp_path) -> None:
    from gyre.engines.trainer import DeepSpeedTrainer

    run_ranks(tiny_model_dir, tmp_path)
    reference = DeepSpeedTrainer(tiny_model_dir, REFERENCE, PolicyObjective(RL))
    total = reference.num_parameters
    for step in range(2):
        micro_batches, advantages = batch_of_three(reference.version)
        acc = reference.accumulate(micro_batches, advantages)
        whole = reference.gradient_vector()
        for rank in range(2):
            shard = torch.load(tmp_path / f"shard-{step}-rank{rank}.pt")
            expected = partition(whole, reference.model, rank)
            assert shard.shape == expected.shape
            assert (shard - expected).abs().max() <= 1e-5 * whole.abs().max()
        reference.apply_step()
        sizes = [
            json.loads((tmp_path / f"sizes-{step}-rank{r}.json").read_text()) for r in range(2)
        ]
        assert sum(s["policy_tokens"] for s in sizes) == acc.policy_tokens == 12
        assert sum(s["loss"] for s in sizes) == pytest.approx(acc.loss, rel=1e-6, abs=1e-9)
        assert_close(
            reference.model, snapshot_state(tmp_path / f"snapshots-{step}" / f"v{step + 1}"), 1e-5
        )

    half = sum(math.ceil(p.numel() / 2) for p in reference.model.parameters())
    for s in sizes:
        assert s["num_parameters"] == total
        assert s["shard_numel"] == half  # P / 2, rounded up per parameter
        assert s["optimizer_state_numel"] == 2 * half  # exp_avg and exp_avg_sq of the shard
    assert reference.optimizer_state_numel() == 2 * total  # one rank holds all of it
    assert 2 * half - total <= sum(1 for _ in reference.model.parameters())  # padding only


def test_float64_at_zero3_is_refused(tiny_model_dir) -> None:
    from gyre.engines.trainer import DeepSpeedTrainer

    config = TrainerConfig(zero_stage=3, dtype="float64")
    with pytest.raises(ValueError, match="dtype='float64' needs zero_stage=0"):
        DeepSpeedTrainer(tiny_model_dir, config, PolicyObjective(RL))


def test_zero_stage_3_is_a_valid_setting_and_4_is_not() -> None:
    assert TrainerConfig(zero_stage=3).zero_stage == 3
    with pytest.raises(ValueError, match="zero_stage=4 must be 0, 1, 2 or 3"):
        TrainerConfig(zero_stage=4)
