"""A supervised agent outlives the worker thread that spawned it (trio spawns from a thread cache
whose idle threads exit after ~10 s; Linux's parent-death signal follows the *thread*)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gyre.sandbox import Limits, run_supervised

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


async def test_agent_survives_its_spawning_thread_exiting(tmp_path) -> None:
    result = await run_supervised(
        [sys.executable, "-c", "import time; time.sleep(13); print('done')"],
        cwd=tmp_path,
        env={},
        limits=Limits(),
        deadline_s=60,
        stdout=open(tmp_path / "out", "wb"),
        stderr=subprocess.DEVNULL,
    )
    assert (result.ended, result.exit_code) == ("exited", 0)
    assert (tmp_path / "out").read_text().strip() == "done"
