"""B39: a `--resume` on another rank count converts the checkpoint, or the preflight refuses it.

A step checkpoint holds the core cell's DeepSpeed trainer, whose ZeRO-3 shards are per rank:
DeepSpeed refuses it at another DP world size ("The checkpoint being loaded used a DP world size
of 2 but the current world size is 1"), and before B39 that surfaced inside the core cell after
every cell had started. Now the trainer records the topology it wrote at (`topology.json`,
`gyre.engines.ds_checkpoint`) and a resume holds it to the run (`gyre.runtime.trainer_checkpoint`):
- another `cells.devices_per_cell` at ZeRO-3 is converted (DeepSpeed's universal checkpoint) and
  loads with the weights, Adam moments and step, schedule and version it was saved with (a real
  2-rank -> 1-rank round trip and back, over gloo: slow);
- another ZeRO stage, dtype or model is refused in the preflight in one line naming the keys with
  the checkpoint's values and the run's, before anything is built or started.
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import socket
from pathlib import Path

import anyio
import msgspec
import pytest
import torch

from gyre.config import config_from_dict
from gyre.engines.ds_checkpoint import (
    CheckpointTopology,
    is_universal,
    model_shapes,
    read_topology,
    write_topology,
)
from gyre.errors import ConfigError
from gyre.job import preflight, run
from gyre.node import main
from gyre.runtime.checkpoint import LoopState, check_run_dir, save_checkpoint
from gyre.runtime.trainer_checkpoint import (
    TRAINER_DIR,
    UNIVERSAL_DIR,
    check_trainer_checkpoint,
)

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "examples/tasks/learnable"
AGENT = Path(__file__).with_name("coin_agent.py")
STATE = LoopState(step=2, version=2, task_cursor=2, dispatched=4)


def make_config(tmp_path: Path, model_dir: Path, *, devices: int, stage: int = 3, **trainer):
    return config_from_dict(
        {
            "run_dir": str(tmp_path / "run"),
            "model": {"path": str(model_dir)},
            "loop": {"steps": 4, "batch_executions": 2, "group_size": 2, "heldout_tasks": 0},
            "cells": {"devices_per_cell": devices},
            "trainer": {"zero_stage": stage, "learning_rate": 1e-3, "warmup_steps": 3, **trainer},
            "tasks": {
                "suites": [str(SUITE)],
                "harness": {"agent_command": ["python", str(AGENT)]},
            },
        }
    )


def killed_run(run_dir: Path, topology: CheckpointTopology) -> Path:
    """A run folder as a run killed after step 2 leaves it, its core's trainer recorded at
    `topology` (what `DeepSpeedTrainer.save_checkpoint` writes beside DeepSpeed's files; the
    slow test below checks the real trainer writes exactly this). Returns the checkpoint."""

    def save_trainer(folder: Path) -> None:
        (folder / TRAINER_DIR).mkdir(parents=True)
        write_topology(folder / TRAINER_DIR, topology)

    return save_checkpoint(run_dir, STATE, save_trainer, keep=2)


def nothing_started(run_dir: Path) -> bool:
    return not (run_dir / "launches.jsonl").exists() and not (run_dir / "cells").exists()


def _past_the_preflight(config):
    raise AssertionError("the preflight passed: the model and the cells were next")


# -- the preflight -------------------------------------------------------------------------------


def test_b39_a_checkpoint_that_cannot_load_is_refused_in_the_preflight_naming_both_keys(
    tiny_model_dir: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    """Written at `cells.devices_per_cell = 2` with `trainer.zero_stage = 3`: a resume at ZeRO
    stage 2 (one device) is refused in one line naming both keys on both sides and what to do;
    so is one at another dtype (naming `trainer.dtype`) and one whose `model.path` holds a model
    of other shapes (naming the first parameter that differs). `python -m gyre.node --resume`
    prints it as one `gyre: error:` line; nothing is built or started (what comes after the
    preflight, `ensure_model`, fails the test at once: before B39 the run went on to start its
    cells, and DeepSpeed failed inside the core)."""
    monkeypatch.setattr("gyre.job.ensure_model", _past_the_preflight)
    shapes = model_shapes(tiny_model_dir)
    assert shapes["lm_head.weight"] == [1024, 128] and len(shapes) == 27  # the tiny model
    saved = CheckpointTopology(ranks=2, zero_stage=3, dtype="float32", parameters=shapes)
    folder = killed_run(tmp_path / "run", saved)
    run_dir = tmp_path / "run"

    stage2 = make_config(tmp_path, tiny_model_dir, devices=1, stage=2)
    expected = (
        f"checkpoint {str(folder)!r} was written at cells.devices_per_cell = 2 with "
        "trainer.zero_stage = 3; this run has cells.devices_per_cell = 1 with "
        "trainer.zero_stage = 2. DeepSpeed loads a checkpoint only at the ZeRO stage, dtype and "
        "model it was written at (another cells.devices_per_cell alone is converted at "
        "trainer.zero_stage = 3): resume with trainer.zero_stage = 3, or start a new run_dir"
    )
    with pytest.raises(ConfigError) as refused:
        run(stage2, resume=True)
    assert str(refused.value) == expected
    assert nothing_started(run_dir)

    bf16 = make_config(tmp_path, tiny_model_dir, devices=2, dtype="bfloat16")
    with pytest.raises(ConfigError) as refused:
        preflight(bf16, resume=True)
    assert (
        "was written at cells.devices_per_cell = 2 with trainer.zero_stage = 3 and trainer.dtype "
        "= 'float32'; this run has cells.devices_per_cell = 2 with trainer.zero_stage = 3 and "
        "trainer.dtype = 'bfloat16'. "
    ) in str(refused.value)
    assert str(refused.value).endswith(
        "resume with trainer.dtype = 'float32', or start a new run_dir"
    )

    other = tmp_path / "other-model"  # a wider MLP: 256 where the run's model has 384
    other.mkdir()
    raw = json.loads((tiny_model_dir / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**raw, "intermediate_size": 256}))
    with pytest.raises(ConfigError) as refused:
        preflight(make_config(tmp_path, other, devices=1), resume=True)
    assert (
        f"this run has cells.devices_per_cell = 1 with trainer.zero_stage = 3, and model.path = "
        f"{str(other)!r}, whose parameter model.layers.0.mlp.down_proj.weight is [128, 256] "
        "where the checkpoint's is [128, 384] (6 parameters differ). "
    ) in str(refused.value)
    assert str(refused.value).endswith(
        "resume with the run's own model.path, or start a new run_dir"
    )

    toml = tmp_path / "stage2.toml"
    toml.write_text(
        f'run_dir = "{run_dir}"\n'
        f'[model]\npath = "{tiny_model_dir}"\n'
        "[loop]\nsteps = 4\nbatch_executions = 2\ngroup_size = 2\nheldout_tasks = 0\n"
        "[cells]\ndevices_per_cell = 1\n"
        "[trainer]\nzero_stage = 2\nlearning_rate = 1e-3\nwarmup_steps = 3\n"
        f'[tasks]\nsuites = ["{SUITE}"]\n'
        f'[tasks.harness]\nagent_command = ["python", "{AGENT}"]\n'
    )
    capsys.readouterr()
    assert main(["--config", str(toml), "--resume"]) == 2
    assert capsys.readouterr().err == f"gyre: error: {expected}\n"
    assert nothing_started(run_dir)


def test_b39_another_rank_count_alone_passes_the_preflight_to_be_converted(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """At ZeRO-3 either way, 2 -> 1 and 1 -> 2 devices per cell pass the preflight, planned as a
    conversion; the same count loads as written, and so does a checkpoint of a gyre that
    recorded no topology (DeepSpeed decides, as before)."""
    shapes = model_shapes(tiny_model_dir)
    for saved_k, now_k in ((2, 1), (1, 2)):
        run_dir = tmp_path / f"run-{saved_k}-{now_k}"
        saved = CheckpointTopology(ranks=saved_k, zero_stage=3, dtype="float32", parameters=shapes)
        folder = killed_run(run_dir, saved)
        config = msgspec.structs.replace(
            make_config(tmp_path, tiny_model_dir, devices=now_k), run_dir=str(run_dir)
        )
        found = preflight(config, resume=True)
        assert found == (STATE, folder / "trainer")
        assert check_trainer_checkpoint(config, folder / "trainer") == "universal"
        same = msgspec.structs.replace(
            make_config(tmp_path, tiny_model_dir, devices=saved_k), run_dir=str(run_dir)
        )
        assert check_trainer_checkpoint(same, folder / "trainer") == "as_written"
        (folder / "trainer" / TRAINER_DIR / "topology.json").unlink()  # an older gyre's
        assert check_trainer_checkpoint(config, folder / "trainer") == "as_written"


# -- a real round trip over gloo ----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def full_state(trainer) -> dict:
    """Every parameter's whole fp32 value and Adam moments (DeepSpeed's own readers, a
    collective on every rank), the Adam step, the version and the warm-up's state."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    out: dict = {}
    for name, p in trainer.engine.module.named_parameters():
        out[f"{name}/fp32"] = safe_get_full_fp32_param(p).clone()
        for key in ("exp_avg", "exp_avg_sq"):
            out[f"{name}/{key}"] = safe_get_full_optimizer_state(p, key).clone()
    adam = trainer.engine.optimizer.optimizer.state.values()
    out["adam_steps"] = sorted({int(s["step"]) for s in adam})
    out["version"] = trainer.version
    out["schedule"] = trainer._scheduler.state_dict()
    return out


def rank_main(rank: int, world: int, port: int, model_dir: str, mode: str, path: str, out: str):
    """One rank of a `world`-rank ZeRO-3 trainer. `save`: two steps on its share of the batch,
    then its state (rank 0 writes it) and a checkpoint at `path`. `load`: the checkpoint as
    written is refused (rank 0 writes the error), then `path` loads and its state is written."""
    from gyre.config import RLConfig
    from gyre.engines.ds_checkpoint import TopologyError
    from gyre.engines.trainer import DeepSpeedTrainer, init_process_group
    from gyre.rl import PolicyObjective
    from tests.cell.test_roles import batch_of_three

    init_process_group(rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
    config = make_config(Path(out), Path(model_dir), devices=world).trainer
    trainer = DeepSpeedTrainer(model_dir, config, PolicyObjective(RLConfig()))
    out_dir = Path(out)
    if mode == "save":
        for _ in range(2):
            micro_batches, advantages = batch_of_three(trainer.version)
            trainer.accumulate(micro_batches[rank::world], advantages, passes=-(-3 // world))
            assert trainer.apply_step().applied
        state = full_state(trainer)
        trainer.save_checkpoint(path)
    else:
        written = Path(path).parent / "trainer" / TRAINER_DIR  # beside its conversion
        try:
            trainer.load_checkpoint(written)
        except TopologyError as exc:
            refusal = str(exc)
        else:
            refusal = "loaded"
        trainer.load_checkpoint(path)
        state = full_state(trainer)
        if rank == 0:
            (out_dir / "refusal.txt").write_text(refusal)
    if rank == 0:
        torch.save(state, out_dir / f"{mode}.pt")


def run_ranks(world: int, model_dir: Path, mode: str, path: Path, out: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    port = _free_port()
    args = (world, port, str(model_dir), mode, str(path), str(out))
    procs = [ctx.Process(target=rank_main, args=(rank, *args)) for rank in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
    assert [p.exitcode for p in procs] == [0] * world


class CoreDouble:
    """The core cell as `RunJournal.restore_cells` drives it: its trainer's load runs on `world`
    real ranks; the engines' weights are not under test."""

    def __init__(self, world: int, model_dir: Path, out: Path) -> None:
        self.world, self.model_dir, self.out = world, model_dir, out
        self.loaded: list[str] = []

    async def load_checkpoint(self, path: str) -> None:
        self.loaded.append(path)
        await anyio.to_thread.run_sync(
            run_ranks, self.world, self.model_dir, "load", Path(path), self.out
        )

    async def load_weights(self, path: str, version: int) -> None:
        pass


@pytest.mark.slow  # 2 + 1 DeepSpeed ZeRO-3 ranks in processes and DeepSpeed's converter: ~40 s
@pytest.mark.parametrize(("saved_k", "now_k"), [(2, 1), (1, 2)])
@pytest.mark.parametrize("anyio_backend", ["trio"])  # the node's backend
@pytest.mark.anyio
async def test_b39_a_resume_on_another_rank_count_converts_the_checkpoint(
    tiny_model_dir: Path, tmp_path: Path, saved_k: int, now_k: int
) -> None:
    """A ZeRO-3 trainer on `saved_k` ranks trains two steps and is checkpointed as a run's step
    (its record: exactly what the quick tests above write); the run resumes with
    `cells.devices_per_cell = now_k`. The preflight plans a conversion, the journal converts it
    once before any cell starts (`step-2/universal/`, outside the manifest of `trainer/`), and
    the core's trainer on `now_k` ranks, which refuses the checkpoint as written with a
    `TopologyError` (not DeepSpeed's error), loads the conversion: every parameter, both Adam
    moments, the Adam step, the version and the warm-up's state equal what the `saved_k` ranks
    held when they saved (DeepSpeed's own full-state readers on both sides)."""
    from gyre.rollout.tasks import split_tasks
    from gyre.runtime.elastic_resume import LAUNCHES_FILE, RunJournal

    out = tmp_path / "out"
    out.mkdir()
    config = make_config(tmp_path, tiny_model_dir, devices=now_k)
    run_dir = tmp_path / "run"

    def save_trainer(folder: Path) -> None:
        run_ranks(saved_k, tiny_model_dir, "save", folder / TRAINER_DIR, out)

    folder = save_checkpoint(run_dir, STATE, save_trainer, keep=2)
    shapes = model_shapes(tiny_model_dir)
    assert read_topology(folder / "trainer" / TRAINER_DIR) == CheckpointTopology(
        ranks=saved_k, zero_stage=3, dtype="float32", parameters=shapes
    )
    found = preflight(config, resume=True)
    assert found == (STATE, folder / "trainer")
    assert check_trainer_checkpoint(config, found[1], model_dir=tiny_model_dir) == "universal"

    train, heldout = split_tasks(config)
    found = check_run_dir(run_dir, resume=True, records=("calls.log", LAUNCHES_FILE))
    journal = await RunJournal.open(
        config, run_dir, found, tasks=train, heldout=heldout, resume=True
    )
    universal = folder / UNIVERSAL_DIR
    assert journal.load_dir == universal and is_universal(universal)
    assert read_topology(universal) == read_topology(folder / "trainer" / TRAINER_DIR)
    assert check_run_dir(run_dir, resume=True) == found  # the manifest of trainer/ still holds
    core = CoreDouble(now_k, tiny_model_dir, out)
    assert await journal.restore_cells([core], "model", 0) == (str(found[1] / "weights"), 2)
    assert core.loaded == [str(universal)]

    refusal = (out / "refusal.txt").read_text()
    assert refusal == (
        f"checkpoint {str(folder / 'trainer' / TRAINER_DIR)!r} was written at {saved_k} ranks "
        f"and this trainer has {now_k}: DeepSpeed loads it only converted (`to_universal`)"
    )
    before, after = torch.load(out / "save.pt"), torch.load(out / "load.pt")
    assert before.keys() == after.keys() and len(before) == 3 * len(shapes) + 3
    assert before["version"] == after["version"] == 2
    assert before["adam_steps"] == after["adam_steps"] == [2]
    assert before["schedule"] == after["schedule"] and before["schedule"]["last_epoch"] == 2
    for key, value in before.items():
        if isinstance(value, torch.Tensor):
            assert value.abs().sum() > 0, key  # a trained state, not an empty one
            torch.testing.assert_close(after[key], value, rtol=1e-6, atol=1e-9, msg=key)

    # a second resume reuses the conversion
    stamp = (universal / "latest_universal").stat().st_mtime_ns
    shutil.rmtree(out)
    again = await RunJournal.open(config, run_dir, found, tasks=train, heldout=heldout, resume=True)
    assert again.load_dir == universal
    assert (universal / "latest_universal").stat().st_mtime_ns == stamp
