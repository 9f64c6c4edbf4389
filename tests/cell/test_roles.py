"""Cells that hold a trainer and switch role in-process; core/satellite gradient exchange.

Three cell processes (scripted engine + a real DeepSpeed trainer on the tiny model) form the
run-wide gloo group. The core trains one micro-batch, two satellites (loaded from a v0 snapshot)
train one each and send their gradients; after the core's step the weights equal those of a
fourth trainer, in this process, that trained the whole batch alone (fp32: 1e-5 relative, at
ZeRO-2; fp64: 1e-9, at ZeRO-1), over two steps (Adam state included). The same cells then switch
rollout <-> train and refuse bad input with clear errors while they keep serving.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import anyio
import numpy as np
import pytest
import torch

from gyre.cell.client import CellClient
from gyre.cell.spawn import open_cells, spawn_cell, wait_cell_ready
from gyre.config import EngineConfig, RLConfig, TrainerConfig
from gyre.engines import GenerateRequest, SamplingParams, collect
from gyre.errors import EngineTimeoutError, EngineUnavailableError, InvalidRequestError
from gyre.rl import PolicyObjective
from gyre.trajectory.pack import pack_batch
from gyre.trajectory.select import select_trajectories
from gyre.trajectory.tree import build_tree
from tests.trajectory.builders import make_call

pytestmark = pytest.mark.slow  # three DeepSpeed inits in cell processes: ~30-60 s on 2 cores

deepspeed = pytest.importorskip(
    "deepspeed", reason="DeepSpeed is not installed (pip install -e .[cpu])"
)

CONFIG = EngineConfig(
    backend="scripted", max_model_len=64, request_timeout_s=60.0, startup_timeout_s=300.0
)
FP32 = TrainerConfig(learning_rate=1e-3, grad_clip=1.0, zero_stage=2, train_timeout_s=120.0)
FP64 = TrainerConfig(
    learning_rate=1e-3, grad_clip=1.0, zero_stage=0, dtype="float64", train_timeout_s=120.0
)
RL = RLConfig()


def batch_of_three(version: int):
    """Three executions packed one per micro-batch (budget 12 tokens): one per cell."""
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
    e2 = [
        make_call(
            "e2",
            "f0",
            [30, 31, 32, 33],
            [34, 35, 2],
            logprobs=[-6.6, -6.8, -7.3],
            versions=[version] * 3,
        )
    ]
    items = [
        (t, select_trajectories(t, 4)) for t in (build_tree(e0), build_tree(e1), build_tree(e2))
    ]
    micro_batches = pack_batch(items, token_budget=12)
    assert [mb.execution_ids for mb in micro_batches] == [("e0",), ("e1",), ("e2",)]
    return micro_batches, {"e0": 1.0, "e1": -0.5, "e2": 0.25}


def req(rid: str) -> GenerateRequest:
    return GenerateRequest(
        request_id=rid, prompt_ids=[5, 6, 7], sampling=SamplingParams(max_tokens=4)
    )


def snapshot_state(path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state = {}
    for f in sorted(path.glob("*.safetensors")):
        state.update(load_file(f))
    return state


def assert_close(reference, state, rel: float) -> None:
    """Every parameter of `reference` (a model) equals `state[name]` within `rel` x its
    max |value|."""
    worst = 0.0
    for name, p in reference.named_parameters():
        ref = p.detach()
        got = state[name].to(ref.dtype)
        worst = max(worst, ((got - ref).abs().max() / ref.abs().max()).item())
    assert worst <= rel, worst


async def distributed_steps(cells: list[CellClient], tmp_path, reference, steps: int = 2) -> None:
    """`steps` core + 2-satellite steps vs `reference.train_batch` on the whole batch."""
    core, satellites = cells[0], cells[1:]
    v0 = reference.save_snapshot(
        tmp_path / "v0-root"
    )  # the starting weights, as a core would publish
    assert await core.switch_role("train") >= 0
    for sat in satellites:
        await sat.switch_role("train", str(v0), reference.version)
    snapshot = None
    for _ in range(steps):
        version = reference.version
        micro_batches, advantages = batch_of_three(version)
        if snapshot is not None:
            for sat in satellites:
                await sat.load_trainer_weights(snapshot, version)
        stats = [await cell.train([mb], advantages) for cell, mb in zip(cells, micro_batches)]
        for sat in satellites:  # the node runs each pair concurrently
            async with anyio.create_task_group() as tg:
                tg.start_soon(sat.send_gradients, core.rank)
                tg.start_soon(core.receive_gradients, sat.rank)
        result = await core.step(str(tmp_path / "snapshots"))
        expected = reference.train_batch(micro_batches, advantages)
        assert result.applied and result.version == expected.version == version + 1
        assert sum(s.policy_tokens for s in stats) == expected.policy_tokens == 12  # 3 + 2, 4, 3
        assert sum(s.loss for s in stats) == pytest.approx(expected.loss, rel=1e-6, abs=1e-9)
        if reference.grad_dtype == torch.float32:
            assert result.grad_norm == pytest.approx(expected.grad_norm, rel=1e-5)
        snapshot = result.snapshot
        assert_close(
            reference.model,
            snapshot_state(Path(snapshot)),
            1e-9 if reference.grad_dtype == torch.float64 else 1e-5,
        )
    for sat in satellites:
        cs = await sat.cell_statistics()
        assert (cs.role, cs.has_gradients, cs.gradients_sent) == ("train", False, steps)
    cs = await core.cell_statistics()
    assert (cs.trainer_version, cs.gradients_received, cs.steps_applied) == (
        reference.version,
        2 * steps,
        steps,
    )


@pytest.fixture(scope="module")
def fp32_cells(tiny_model_dir, tmp_path_factory):
    """Three cells (ranks 0-2) with fp32 ZeRO-2 trainers in one gradient group; their URLs."""
    from gyre.cell.grad_group import host_group_store

    store = host_group_store()
    logs = tmp_path_factory.mktemp("cells")
    processes = [
        spawn_cell(
            tiny_model_dir,
            CONFIG,
            log_path=logs / f"cell-{r}.log",
            trainer_config=FP32,
            rl_config=RL,
            rank=r,
            world_size=3,
            group_store=f"127.0.0.1:{store.port}",
        )
        for r in range(3)
    ]
    try:
        yield [wait_cell_ready(p, CONFIG.startup_timeout_s) for p in processes]
    finally:
        for p in processes:
            p.stop()


def clients(urls, config=FP32) -> list[CellClient]:
    out = []
    for rank, url in enumerate(urls):
        client = CellClient(url, CONFIG, config)
        client.rank = rank
        out.append(client)
    return out


def run(fn, cells):
    """Enter the clients and run `fn(clients)` on a fresh event loop (asyncio)."""

    async def main():
        async with AsyncExitStack() as stack:
            entered = [await stack.enter_async_context(c) for c in cells]
            await fn(entered)

    anyio.run(main)


def test_core_and_two_satellites_equal_one_trainer_fp32(
    fp32_cells, tiny_model_dir, tmp_path
) -> None:
    from gyre.engines.trainer import DeepSpeedTrainer

    reference = DeepSpeedTrainer(tiny_model_dir, FP32, PolicyObjective(RL))
    run(lambda cells: distributed_steps(cells, tmp_path, reference), clients(fp32_cells))


def test_core_and_two_satellites_equal_one_trainer_fp64(tiny_model_dir, tmp_path) -> None:
    from gyre.engines.trainer import DeepSpeedTrainer

    reference = DeepSpeedTrainer(tiny_model_dir, FP64, PolicyObjective(RL))
    assert reference.grad_dtype == torch.float64

    async def main():
        async with open_cells(
            3, tiny_model_dir, CONFIG, log_dir=tmp_path / "logs", trainer_config=FP64, rl_config=RL
        ) as cells:
            assert [c.rank for c in cells] == [0, 1, 2]
            await distributed_steps(cells, tmp_path, reference)

    anyio.run(main)


def test_switch_rollout_train_rollout(fp32_cells, tmp_path) -> None:
    async def flow(cells: list[CellClient]) -> None:
        core, sat = cells[0], cells[1]
        for cell in cells:  # the equality test may have left them training
            await cell.switch_role("rollout")
        assert (await sat.cell_statistics()).role == "rollout"
        [c] = await collect(sat, req("before"))
        assert len(c.token_ids) == 4
        micro_batches, advantages = batch_of_three((await sat.cell_statistics()).trainer_version)
        with pytest.raises(InvalidRequestError, match="needs role 'train'"):
            await sat.train(micro_batches[:1], advantages)
        assert await sat.switch_role("rollout") == 0.0  # already there: a no-op
        to_train = await sat.switch_role("train")
        assert to_train > 0
        with pytest.raises(EngineUnavailableError, match="role 'train'"):
            await collect(sat, req("during"))
        stats = await sat.train(micro_batches[1:2], advantages)
        assert stats.micro_batches == 1 and stats.policy_tokens == 4 and stats.finite
        with pytest.raises(InvalidRequestError, match="unsent gradients"):
            await sat.switch_role("rollout")
        await core.switch_role("train")
        async with anyio.create_task_group() as tg:
            tg.start_soon(sat.send_gradients, 0)
            tg.start_soon(core.receive_gradients, 1)
        assert not (await sat.cell_statistics()).has_gradients
        assert (await core.cell_statistics()).has_gradients
        to_rollout = await sat.switch_role("rollout")
        [c] = await collect(sat, req("after"))
        assert len(c.token_ids) == 4
        cs = await sat.cell_statistics()
        assert cs.role == "rollout" and cs.last_switch_s == pytest.approx(to_rollout)
        print(
            f"switch seconds (scripted + trainer): rollout->train {to_train:.4f}, "
            f"train->rollout {to_rollout:.4f}"
        )

    run(flow, clients(fp32_cells))


def test_bad_input_gets_clear_errors_and_the_cell_keeps_serving(tiny_model_dir, tmp_path) -> None:
    process = spawn_cell(
        tiny_model_dir, CONFIG, log_path=tmp_path / "c.log", trainer_config=FP32, rl_config=RL
    )
    try:
        url = wait_cell_ready(process, CONFIG.startup_timeout_s)

        async def flow(cells: list[CellClient]) -> None:
            [cell] = cells
            with pytest.raises(InvalidRequestError, match="role 'sleep' is unknown"):
                await cell.switch_role("sleep")
            await cell.switch_role("train")
            micro_batches, advantages = batch_of_three(0)
            with pytest.raises(InvalidRequestError, match="no advantage"):
                await cell.train(micro_batches, {"e0": 1.0, "e1": 1.0})
            assert not (
                await cell.cell_statistics()
            ).has_gradients  # the refused call added nothing
            with pytest.raises(InvalidRequestError, match="no gradient group"):
                await cell.send_gradients(0)
            with pytest.raises(InvalidRequestError, match="no \\*.safetensors"):
                await cell.load_trainer_weights(str(tmp_path), 3)
            stats = await cell.train(micro_batches, advantages)  # still serving, and it trains
            assert stats.micro_batches == 3 and stats.policy_tokens == 12
            result = await cell.step(str(tmp_path / "snaps"))
            assert result.applied and result.version == 1 and result.snapshot.endswith("v1")
            await cell.switch_role("rollout", result.snapshot, result.version)
            assert (await cell.refresh_statistics()).weight_version == 1
            [c] = await collect(cell, req("ok"))
            assert set(c.versions) == {1}

        run(flow, [CellClient(url, CONFIG, FP32)])
    finally:
        assert process.stop() == 0


def test_packed_batches_cross_the_wire_exactly() -> None:
    from gyre.cell.wire import TrainRequest, decode, encode

    micro_batches, advantages = batch_of_three(3)
    back = decode(
        encode(TrainRequest(micro_batches=micro_batches, advantages=advantages)), TrainRequest
    )
    assert back.advantages == advantages
    for a, b in zip(micro_batches, back.micro_batches):
        assert a.execution_ids == b.execution_ids
        for field in a.__struct_fields__:
            x, y = getattr(a, field), getattr(b, field)
            if isinstance(x, np.ndarray):
                assert (x.dtype, x.shape, x.tobytes()) == (y.dtype, y.shape, y.tobytes()), field


def test_receive_without_a_sender_times_out_with_a_clear_error(tiny_model_dir, tmp_path) -> None:
    short = TrainerConfig(learning_rate=1e-3, zero_stage=0, train_timeout_s=20.0)

    async def main():
        async with open_cells(
            2, tiny_model_dir, CONFIG, log_dir=tmp_path / "logs", trainer_config=short, rl_config=RL
        ) as (core, sat):
            await core.switch_role("train")
            with pytest.raises(EngineTimeoutError, match="receive of gradients from rank 1"):
                await core.receive_gradients(1)  # rank 1 never sends: bounded by train_timeout_s
            with pytest.raises(InvalidRequestError, match="peer rank 0 must be another rank"):
                await core.receive_gradients(0)
            cs = await core.cell_statistics()  # the cell keeps serving
            assert (cs.role, cs.gradients_received) == ("train", 0)
            [c] = await collect(sat, req("still-serving"))
            assert len(c.token_ids) == 4

    anyio.run(main)
