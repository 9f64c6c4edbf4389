"""DeepSpeed's JIT-built comm op lives in this environment's own folder, and a build lock left by a
killed build is cleared instead of hanging every later trainer start (seen in CI: a run whose
trainer tests all waited on `deepspeed_shm_comm/lock` until their 600 s timeouts)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gyre.engines.trainer import STALE_BUILD_LOCK_S, prepare_extensions_dir


def _lock(root: Path, age_s: float) -> Path:
    lock = root / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.touch()
    then = time.time() - age_s
    os.utime(lock, (then, then))
    return lock


def test_defaults_to_this_environments_folder(monkeypatch):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    assert prepare_extensions_dir() == Path(sys.prefix) / "torch_extensions"
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(Path(sys.prefix) / "torch_extensions")


def test_a_folder_the_user_chose_is_kept(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert prepare_extensions_dir() == tmp_path


def test_stale_lock_is_removed_a_live_one_kept(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    stale = _lock(tmp_path, STALE_BUILD_LOCK_S + 60)
    prepare_extensions_dir()
    assert not stale.exists()
    assert "never finished" in caplog.text

    live = _lock(tmp_path, STALE_BUILD_LOCK_S - 60)  # a build that may still be running
    prepare_extensions_dir()
    assert live.exists()


@pytest.mark.slow
def test_build_ops_gets_past_a_stale_lock(tmp_path):
    """The real op and torch's FileBaton: with the op already built and a stale lock beside it,
    `build_ops` finishes (it waited forever before) and leaves no lock."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install -e .[cpu])")
    built = Path(sys.prefix) / "torch_extensions" / "deepspeed_shm_comm"
    if not (built / "deepspeed_shm_comm.so").exists():
        pytest.skip("the op is not prebuilt here (make builds it after the install)")
    root = tmp_path / "ext"
    shutil.copytree(built, root / "deepspeed_shm_comm", ignore=shutil.ignore_patterns("lock"))
    lock = _lock(root, STALE_BUILD_LOCK_S + 60)
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(root))
    subprocess.run(
        [sys.executable, "-c", "from gyre.engines.trainer import build_ops; build_ops()"],
        env=env,
        check=True,
        timeout=300,
        capture_output=True,
    )
    assert not lock.exists()
    assert (root / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").exists()
