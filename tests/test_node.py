"""`python -m gyre.node`: Ctrl-C anywhere in the job (a bare KeyboardInterrupt, or one that trio and
anyio raise out of task groups wrapped in exception groups) is one line and exit status 130; any
other exception, even next to it in a group, still propagates. A `GyreError` raised out of task
groups (a cell that died) is one `gyre: error:` line and exit status 2, like one raised bare."""

from __future__ import annotations

from pathlib import Path

import pytest

import gyre
import gyre.job
from gyre.node import main


def raising(exc: BaseException):
    def run(config, *, resume: bool = False):
        raise exc

    return run


@pytest.mark.parametrize(
    "exc",
    [
        KeyboardInterrupt(),
        BaseExceptionGroup("task group", [KeyboardInterrupt()]),
        BaseExceptionGroup(
            "outer", [BaseExceptionGroup("inner", [KeyboardInterrupt()]), KeyboardInterrupt()]
        ),
    ],
    ids=["bare", "group", "nested"],
)
def test_interrupt_is_one_line_and_status_130(monkeypatch, capsys, exc) -> None:
    monkeypatch.setattr(gyre.job, "run", raising(exc))
    assert main(["--config", "examples/cpu.toml"]) == 130
    assert capsys.readouterr().err.strip().splitlines() == [
        "gyre: interrupted; `python -m gyre.node --config examples/cpu.toml --resume` "
        "continues from the last checkpoint"
    ]


def test_a_real_failure_beside_an_interrupt_still_propagates(monkeypatch) -> None:
    group = BaseExceptionGroup("task group", [KeyboardInterrupt(), RuntimeError("engine crashed")])
    monkeypatch.setattr(gyre.job, "run", raising(group))
    with pytest.raises(BaseExceptionGroup) as caught:
        main(["--config", "examples/cpu.toml"])
    assert caught.value is group


def test_python_m_gyre_names_the_commands() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "gyre"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    named = [line.split()[2] for line in done.stderr.splitlines()[2:]]
    assert named == [
        "gyre.node",
        "gyre.node",
        "gyre.gateway",
        "gyre.report",
        "gyre.model",
        "gyre.sim",
        "gyre.tasks",
    ]
    # every package of gyre with a command (a __main__.py) is named, and gyre's own is not
    root = Path(gyre.__file__).parent
    commands = {f"gyre.{p.parent.name}" for p in root.glob("*/__main__.py")}
    assert commands <= set(named) and "gyre" not in named


def test_a_gyre_error_out_of_task_groups_is_one_line_and_status_2(monkeypatch, capsys) -> None:
    """A cell killed mid-run (benchmarks/bench_faults.py): its EngineUnavailableError reaches
    main wrapped in trio's exception groups, and is still one `gyre: error:` line."""
    from gyre.errors import EngineUnavailableError

    error = EngineUnavailableError("cell http://127.0.0.1:1 /load_weights: ConnectError")
    group = BaseExceptionGroup("outer", [BaseExceptionGroup("nursery", [error])])
    monkeypatch.setattr(gyre.job, "run", raising(group))
    assert main(["--config", "examples/cpu.toml"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"gyre: error: {error}"]


def test_a_group_with_a_gyre_error_and_a_bug_still_propagates(monkeypatch) -> None:
    from gyre.errors import EngineUnavailableError

    group = BaseExceptionGroup("task group", [EngineUnavailableError("gone"), RuntimeError("bug")])
    monkeypatch.setattr(gyre.job, "run", raising(group))
    with pytest.raises(BaseExceptionGroup) as caught:
        main(["--config", "examples/cpu.toml"])
    assert caught.value is group
