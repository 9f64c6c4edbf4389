"""`python -m gyre.node`: Ctrl-C anywhere in the job (a bare KeyboardInterrupt, or one that trio and
anyio raise out of task groups wrapped in exception groups) is one line and exit status 130; any
other exception, even next to it in a group, still propagates."""

from __future__ import annotations

import pytest

import gyre.job
from gyre.node import main


def raising(exc: BaseException):
    def run(config, *, resume: bool = False):
        raise exc
    return run


@pytest.mark.parametrize("exc", [
    KeyboardInterrupt(),
    BaseExceptionGroup("task group", [KeyboardInterrupt()]),
    BaseExceptionGroup("outer", [BaseExceptionGroup("inner", [KeyboardInterrupt()]), KeyboardInterrupt()]),
], ids=["bare", "group", "nested"])
def test_interrupt_is_one_line_and_status_130(monkeypatch, capsys, exc) -> None:
    monkeypatch.setattr(gyre.job, "run", raising(exc))
    assert main(["--config", "examples/cpu.toml"]) == 130
    assert capsys.readouterr().err.strip().splitlines() == [
        "gyre: interrupted; `python -m gyre.node --config examples/cpu.toml --resume` continues from the last checkpoint"]


def test_a_real_failure_beside_an_interrupt_still_propagates(monkeypatch) -> None:
    group = BaseExceptionGroup("task group", [KeyboardInterrupt(), RuntimeError("engine crashed")])
    monkeypatch.setattr(gyre.job, "run", raising(group))
    with pytest.raises(BaseExceptionGroup) as caught:
        main(["--config", "examples/cpu.toml"])
    assert caught.value is group


def test_python_m_gyre_names_the_commands() -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "gyre"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert [line.split()[2] for line in done.stderr.splitlines()[2:]] == ["gyre.node", "gyre.report", "gyre.model", "gyre.sim"]
