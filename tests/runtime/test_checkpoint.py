"""Checkpoints on disk: a corrupt newest checkpoint stops a resume with one clear error that names
the file (benchmarks/bench_faults.py, corrupt checkpoint), instead of a decoder traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from gyre.errors import RunDirError
from gyre.runtime.checkpoint import LoopState, check_run_dir, save_checkpoint


def test_a_corrupt_checkpoint_state_is_a_run_dir_error_naming_the_file(tmp_path: Path) -> None:
    save_checkpoint(
        tmp_path, LoopState(step=1, version=1, task_cursor=2), lambda folder: folder.mkdir(), keep=2
    )
    state, trainer = check_run_dir(tmp_path, resume=True)
    assert state == LoopState(step=1, version=1, task_cursor=2)
    assert trainer == tmp_path / "checkpoints" / "step-1" / "trainer"
    path = tmp_path / "checkpoints" / "step-1" / "state.json"
    path.write_bytes(b"\xff" * 16 + path.read_bytes()[16:])
    with pytest.raises(RunDirError, match="step-1/state.json' cannot be read"):
        check_run_dir(tmp_path, resume=True)
