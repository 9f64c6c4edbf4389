"""Checkpoints on disk: a corrupt newest checkpoint stops a resume with one clear error that names
the file (benchmarks/bench_faults.py, corrupt checkpoint), instead of a decoder traceback or, for
a corrupt trainer file, weights that load as garbage without an error."""

from __future__ import annotations

from pathlib import Path

import pytest

from gyre.errors import RunDirError
from gyre.runtime.checkpoint import LoopState, check_run_dir, save_checkpoint

STATE = LoopState(step=1, version=1, task_cursor=2)


def fake_trainer(folder: Path) -> None:
    (folder / "state").mkdir(parents=True)
    (folder / "state" / "mp_rank_00_model_states.pt").write_bytes(bytes(range(256)) * 64)
    (folder / "latest").write_text("state")


def saved(run_dir: Path) -> Path:
    folder = save_checkpoint(run_dir, STATE, fake_trainer, keep=2)
    assert check_run_dir(run_dir, resume=True) == (STATE, folder / "trainer")
    return folder


def test_a_corrupt_checkpoint_state_is_a_run_dir_error_naming_the_file(tmp_path: Path) -> None:
    path = saved(tmp_path) / "state.json"
    path.write_bytes(b"\xff" * 16 + path.read_bytes()[16:])
    with pytest.raises(RunDirError, match="step-1' cannot be read .*JSON is malformed"):
        check_run_dir(tmp_path, resume=True)


def test_a_corrupt_trainer_file_is_a_run_dir_error_naming_the_file(tmp_path: Path) -> None:
    path = saved(tmp_path) / "trainer" / "state" / "mp_rank_00_model_states.pt"
    data = bytearray(path.read_bytes())
    data[8000:8004] = b"\xff\xff\xff\xff"  # same size: only a checksum tells
    path.write_bytes(bytes(data))
    with pytest.raises(RunDirError, match="trainer/state/mp_rank_00_model_states.pt differs"):
        check_run_dir(tmp_path, resume=True)


def test_a_checkpoint_without_a_manifest_still_resumes(tmp_path: Path) -> None:
    folder = saved(tmp_path)
    (folder / "manifest.json").unlink()  # written before manifests existed
    assert check_run_dir(tmp_path, resume=True) == (STATE, folder / "trainer")
