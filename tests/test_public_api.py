"""The public API is exactly what `__all__` says (docs/style.md rule 1)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import gyre

PACKAGES = ["gyre"] + sorted(
    info.name for info in pkgutil.walk_packages(gyre.__path__, "gyre.") if info.ispkg
)
"""Every package of gyre, found on disk: a new package is covered without editing this list."""


def test_every_package_is_covered() -> None:
    """The discovery above is not vacuous: it finds the packages of docs/design.md's layers."""
    for name in [
        "gyre.engines",
        "gyre.tito",
        "gyre.trajectory",
        "gyre.rl",
        "gyre.sandbox",
        "gyre.tasks",
        "gyre.agents",
        "gyre.model",
        "gyre.runtime",
        "gyre.report",
        "gyre.sim",
        "gyre.kernels",
    ]:
        assert name in PACKAGES


def test_top_level_api() -> None:
    assert sorted(gyre.__all__) == ["RunConfig", "load_config", "run"]
    assert callable(gyre.run) and callable(gyre.load_config)
    # `dir(gyre)` shows the API and gyre's own modules, not `typing` or `annotations`
    public = [n for n in dir(gyre) if not n.startswith("_")]
    modules = {n for n in public if isinstance(getattr(gyre, n), type(gyre))}
    assert sorted(set(public) - modules) == ["RunConfig", "load_config", "run"]
    assert all(getattr(gyre, m).__name__ == f"gyre.{m}" for m in modules)


@pytest.mark.parametrize("name", [*PACKAGES, "gyre.errors"])
def test_all_is_exactly_the_public_api(name: str) -> None:
    """Every public name (lazy ones included: `dir()` lists them) is in `__all__` and resolves."""
    module = importlib.import_module(name)
    public = {
        n
        for n in dir(module)
        if not n.startswith("_") and not isinstance(getattr(module, n), type(module))
    }
    public.discard("annotations")  # `from __future__ import annotations`
    assert set(module.__all__) == public
    assert all(getattr(module, n) is not None for n in module.__all__)


def test_agent_process_imports_neither_the_runtime_nor_torch() -> None:
    """Every execution starts `python -m gyre.agents.react`; importing `gyre` eagerly cost 1.4 s
    of torch and runtime."""
    import subprocess
    import sys

    probe = (
        "import sys, gyre.agents.react; "
        "print(' '.join(m for m in ('torch', 'gyre.runtime', 'gyre.agents.harness', 'gyre.tito') "
        "if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == []


def test_lazy_exports_resolve_to_their_modules_and_reject_unknown_names() -> None:
    import gyre.agents
    from gyre.agents.harness import Harness
    from gyre.job import run

    assert gyre.run is run and gyre.agents.Harness is Harness
    assert "run" in dir(gyre) and "Harness" in dir(gyre.agents)
    with pytest.raises(AttributeError, match="'gyre' has no attribute 'nope'"):
        gyre.nope  # noqa: B018


@pytest.mark.parametrize("module", ["gyre.job", "gyre.agents.react"])
def test_the_node_and_the_agent_start_without_torch(module: str) -> None:
    """`gyre.job` checks a config (the preflight's `gyre: error:` lines) before anything heavy is
    imported, and every execution's agent process imports `gyre.agents.react`: neither may pull in
    torch or transformers at import (a resume check imported at the top of `gyre.job` did)."""
    import subprocess
    import sys

    code = (
        f"import sys, {module}; "
        "print(','.join(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""
