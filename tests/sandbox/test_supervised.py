"""Supervised process trees: resource limits, and nothing of the tree survives its end."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pytest

from gyre.sandbox import Limits, run_supervised

pytestmark = pytest.mark.anyio

# Forks a child that ignores SIGTERM and a grandchild that leaves the session (setsid) and is
# orphaned (double fork); writes their PIDs, then ignores SIGTERM itself and sleeps.
EVIL = r"""
import os, signal, sys, time
pids = [os.getpid()]
if os.fork() == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(600)
    os._exit(0)
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.write(w, str(os.getpid()).encode())
        os.close(w)
        time.sleep(600)
        os._exit(0)
    os._exit(0)
pids.append(int(os.read(r, 32)))
for line in os.popen("cat /proc/%d/task/%d/children" % (os.getpid(), os.getpid())).read().split():
    pids.append(int(line))
open(sys.argv[1], "w").write(" ".join(map(str, sorted(set(pids)))))
signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(600)
"""


DEADLINE_S = 8.0
"""Long enough for the script to start and fork on a loaded machine before it is killed."""


def alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def wait_for_file(path: Path) -> str:
    with anyio.fail_after(30):
        while not path.exists() or not path.read_text():
            await anyio.sleep(0.05)
    return path.read_text()


@pytest.mark.slow
async def test_deadline_kills_a_tree_that_ignores_sigterm(tmp_path: Path) -> None:
    (tmp_path / "evil.py").write_text(EVIL)
    pidfile = tmp_path / "pids"
    with open(tmp_path / "out", "wb") as out:
        result = await run_supervised(
            [sys.executable, str(tmp_path / "evil.py"), str(pidfile)],
            cwd=tmp_path,
            env=dict(os.environ),
            limits=Limits(),
            deadline_s=DEADLINE_S,
            stdout=out,
            stderr=out,
            kill_grace_s=0.5,
        )
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) >= 3  # agent, its child, the setsid grandchild
    assert result.ended == "deadline"
    assert result.wall_s <= DEADLINE_S + 2.0  # bound: gone within 2 s of the deadline
    assert [p for p in pids if alive(p)] == []
    assert not alive(result.pid)


async def test_stop_event_and_cancellation_end_the_tree(tmp_path: Path) -> None:
    (tmp_path / "evil.py").write_text(EVIL)
    stop = anyio.Event()
    pidfile = tmp_path / "pids"

    async def stop_when_started() -> None:
        await wait_for_file(pidfile)
        stop.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stop_when_started)
        result = await run_supervised(
            [sys.executable, str(tmp_path / "evil.py"), str(pidfile)],
            cwd=tmp_path,
            env=dict(os.environ),
            limits=Limits(),
            deadline_s=60,
            stdout=-3,
            stderr=-3,
            kill_grace_s=0.2,
            stop=stop,
        )
    assert result.ended == "stopped"
    assert [p for p in map(int, pidfile.read_text().split()) if alive(p)] == []

    pidfile2 = tmp_path / "pids2"
    async with anyio.create_task_group() as tg:

        async def cancel_when_started() -> None:
            await wait_for_file(pidfile2)
            tg.cancel_scope.cancel()

        tg.start_soon(cancel_when_started)
        await run_supervised(
            [sys.executable, str(tmp_path / "evil.py"), str(pidfile2)],
            cwd=tmp_path,
            env=dict(os.environ),
            limits=Limits(),
            deadline_s=60,
            stdout=-3,
            stderr=-3,
            kill_grace_s=0.2,
        )
    assert [p for p in map(int, pidfile2.read_text().split()) if alive(p)] == []


async def test_exit_code_and_leftovers_of_a_finished_command(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    script = (
        "import subprocess, sys; p = subprocess.Popen(['sleep', '600']); "
        f"open({str(pidfile)!r}, 'w').write(str(p.pid)); sys.exit(7)"
    )
    result = await run_supervised(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=dict(os.environ),
        limits=Limits(),
        deadline_s=30,
        stdout=-3,
        stderr=-3,
    )
    assert (result.ended, result.exit_code) == ("exited", 7)
    assert not alive(int(pidfile.read_text()))


async def test_missing_command_exits_127(tmp_path: Path) -> None:
    with open(tmp_path / "err", "wb") as err:
        result = await run_supervised(
            ["/nonexistent/agent"],
            cwd=tmp_path,
            env=dict(os.environ),
            limits=Limits(),
            deadline_s=30,
            stdout=-3,
            stderr=err,
        )
    assert (result.ended, result.exit_code) == ("exited", 127)
    assert "cannot run '/nonexistent/agent'" in (tmp_path / "err").read_text()


@pytest.mark.parametrize(
    "limits, script, expected",
    [
        # RLIMIT_FSIZE: Python ignores SIGXFSZ, so writing past the limit is an OSError (EFBIG)
        (Limits(file_size_bytes=1000), "f = open('big', 'wb'); f.write(b'x' * 5000); f.flush()", 1),
        # RLIMIT_AS: a 2 GiB allocation under a 1 GiB limit is a MemoryError (exit 1 with a
        # traceback)
        (Limits(memory_bytes=2**30), "b = bytearray(2 * 2**30)", 1),
        # RLIMIT_CPU: 1 CPU second, then SIGXCPU (24)
        (Limits(cpu_time_s=1), "while True: pass", 128 + 24),
    ],
)
async def test_resource_limits(tmp_path: Path, limits: Limits, script: str, expected: int) -> None:
    result = await run_supervised(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=dict(os.environ),
        limits=limits,
        deadline_s=60,
        stdout=-3,
        stderr=-3,
    )
    assert (result.ended, result.exit_code) == ("exited", expected)
    if limits.file_size_bytes:
        assert (tmp_path / "big").stat().st_size <= limits.file_size_bytes


@pytest.mark.skipif(os.geteuid() == 0, reason="root (CAP_SYS_RESOURCE) is exempt from RLIMIT_NPROC")
async def test_process_limit(tmp_path: Path) -> None:
    script = (
        "import subprocess\nn = 0\ntry:\n    for _ in range(200):\n"
        "        subprocess.Popen(['sleep', '60']); n += 1\nexcept OSError:\n    pass\n"
        f"open({str(tmp_path / 'n')!r}, 'w').write(str(n))\n"
    )
    result = await run_supervised(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=dict(os.environ),
        limits=Limits(max_processes=20),
        deadline_s=60,
        stdout=-3,
        stderr=-3,
    )
    assert result.ended == "exited"
    assert 0 < int((tmp_path / "n").read_text()) < 200


def test_limits_validation() -> None:
    with pytest.raises(ValueError, match="memory_bytes=-1"):
        Limits(memory_bytes=-1)
