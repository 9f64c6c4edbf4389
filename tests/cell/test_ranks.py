"""Cells of 2 devices: 2 trainer ranks each (ZeRO-3 over gloo), gradients exchanged by shard.

Two cells (scripted engine) with `devices_per_cell=2` are 4 trainer processes: each cell process
is rank 0 of its cell and starts rank 1 (`gyre.cell.ranks`); the run-wide group has 4
ranks, cell c's ranks at 2c and 2c + 1. The core trains micro-batches 0 and 1 (one per rank),
the satellite micro-batch 2 (rank 1 runs a zero pass); the satellite's rank r sends its shard to
the core's rank r, and the core's step equals a 1-rank ZeRO-0 trainer in this process on the
whole batch (fp32, 1e-5 relative, two steps, the satellite reloading the core's snapshot); bad
input is refused with a 4xx error on every rank alike and the ranks stay in step; a checkpoint
(every rank's shards) restored and the step replayed gives the same weights bit for bit. The
GPU twins (device placement per cell, the exchange over NCCL) skip here with the reason.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
import torch

from gyre.cell.spawn import open_cells
from gyre.config import RLConfig, TrainerConfig
from gyre.errors import InvalidRequestError
from gyre.rl import PolicyObjective
from tests.cell.test_roles import CONFIG, assert_close, batch_of_three, snapshot_state

ZERO3 = TrainerConfig(learning_rate=1e-3, grad_clip=0.0, zero_stage=3, train_timeout_s=300.0)
REFERENCE = TrainerConfig(learning_rate=1e-3, grad_clip=0.0, zero_stage=0)
RL = RLConfig()

needs_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 4,
    reason="needs 4 CUDA devices (2 cells x 2 devices)",
)


async def two_cells_two_steps(tiny_model_dir: Path, tmp_path: Path) -> None:
    from gyre.engines.trainer import DeepSpeedTrainer

    reference = DeepSpeedTrainer(tiny_model_dir, REFERENCE, PolicyObjective(RL))
    v0 = reference.save_snapshot(tmp_path / "v0-root")
    async with open_cells(
        2,
        tiny_model_dir,
        CONFIG,
        log_dir=tmp_path / "logs",
        trainer_config=ZERO3,
        rl_config=RL,
        devices_per_cell=2,
    ) as (core, satellite):
        assert (core.rank, satellite.rank) == (0, 1)
        await core.switch_role("train")
        await satellite.switch_role("train", str(v0), 0)
        # bad input: refused on every rank alike, and the ranks stay in step (the steps below)
        with pytest.raises(InvalidRequestError, match=r"no \*\.safetensors"):
            await satellite.load_trainer_weights(str(tmp_path / "nowhere"), 1)
        with pytest.raises(InvalidRequestError, match="have no advantage"):
            await core.train(batch_of_three(0)[0][:2], {})
        snapshot, snapshots = None, []
        for step in range(2):
            micro_batches, advantages = batch_of_three(reference.version)
            if snapshot is not None:
                await satellite.load_trainer_weights(snapshot, reference.version)
            ours = await core.train(micro_batches[:2], advantages)
            theirs = await satellite.train(micro_batches[2:], advantages)
            async with anyio.create_task_group() as tg:
                tg.start_soon(satellite.send_gradients, core.rank)
                tg.start_soon(core.receive_gradients, satellite.rank)
            result = await core.step(str(tmp_path / "snapshots"))
            expected = reference.train_batch(micro_batches, advantages)
            assert result.applied and result.version == expected.version == step + 1
            assert (ours.micro_batches, theirs.micro_batches) == (2, 1)
            assert ours.policy_tokens + theirs.policy_tokens == expected.policy_tokens == 12
            assert ours.loss + theirs.loss == pytest.approx(expected.loss, rel=1e-6, abs=1e-9)
            snapshot = result.snapshot
            snapshots.append(snapshot)
            assert_close(reference.model, snapshot_state(Path(snapshot)), 1e-5)
            if step == 0:  # every rank writes its shards of the weights and Adam state
                await core.save_checkpoint(str(tmp_path / "checkpoint"))
        core_stats, sat_stats = await core.cell_statistics(), await satellite.cell_statistics()
        # rank 0 of cell 0 and of cell 1 in the run-wide group of 2 x 2 ranks
        assert (core_stats.group_rank, sat_stats.group_rank) == (0, 2)
        assert (sat_stats.gradients_sent, sat_stats.has_gradients) == (2, False)
        assert (core_stats.gradients_received, core_stats.steps_applied) == (2, 2)
        assert core_stats.trainer_version == 2

        # back to the checkpoint of version 1: the second step again gives the same weights
        await core.load_checkpoint(str(tmp_path / "checkpoint"))
        assert (await core.cell_statistics()).trainer_version == 1
        micro_batches, advantages = batch_of_three(1)
        await satellite.load_trainer_weights(snapshots[0], 1)
        await core.train(micro_batches[:2], advantages)
        await satellite.train(micro_batches[2:], advantages)
        async with anyio.create_task_group() as tg:
            tg.start_soon(satellite.send_gradients, core.rank)
            tg.start_soon(core.receive_gradients, satellite.rank)
        replay = await core.step(str(tmp_path / "replay"))
        assert replay.version == 2
        again, before = snapshot_state(Path(replay.snapshot)), snapshot_state(Path(snapshots[1]))
        assert all(torch.equal(again[name], before[name]) for name in before)


@pytest.mark.slow  # 4 DeepSpeed ZeRO-3 ranks in processes: ~1-2 min on 2 cores
def test_two_cells_of_two_ranks_exchange_shards_and_equal_one_trainer(
    tiny_model_dir, tmp_path
) -> None:
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install -e .[cpu])")
    anyio.run(two_cells_two_steps, tiny_model_dir, tmp_path)


def test_devices_per_cell_is_checked() -> None:
    from gyre.config import CellConfig

    assert CellConfig().devices_per_cell == 1
    with pytest.raises(ValueError, match="devices_per_cell=0 must be > 0"):
        CellConfig(devices_per_cell=0)

    async def below_zero3() -> None:
        async with open_cells(
            1, "/nowhere", CONFIG, log_dir="/nowhere", trainer_config=REFERENCE, devices_per_cell=2
        ):
            pass

    with pytest.raises(ValueError, match="devices_per_cell=2 needs trainer.zero_stage=3"):
        anyio.run(below_zero3)


@pytest.mark.gpu
@needs_gpus
def test_gpu_each_cell_sees_only_its_devices(tmp_path) -> None:
    """Placement: cell i of 2-device cells gets physical devices 2i and 2i + 1."""
    from gyre.cell.spawn import cell_devices

    assert cell_devices(0, 2) == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert cell_devices(1, 2) == {"CUDA_VISIBLE_DEVICES": "2,3"}
    with pytest.raises(ValueError, match="needs devices"):
        cell_devices(torch.cuda.device_count(), 2)


@pytest.mark.gpu
@pytest.mark.slow
@needs_gpus
def test_gpu_two_cells_exchange_shards_over_nccl(tiny_model_dir, tmp_path) -> None:
    """The same run on 4 GPUs: each rank trains on its own device, the run-wide group is NCCL
    (`GradientGroup` picks it where CUDA is available) and the step still equals one trainer."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed")
    anyio.run(two_cells_two_steps, tiny_model_dir, tmp_path)
