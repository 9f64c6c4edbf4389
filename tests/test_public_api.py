"""The public API is exactly what `__all__` says (STYLE.md rule 1)."""

from __future__ import annotations

import importlib

import pytest

import gyre

PACKAGES = ["gyre", "gyre.engines", "gyre.model"]


def test_top_level_api() -> None:
    assert sorted(gyre.__all__) == ["RunConfig", "load_config", "run"]
    assert callable(gyre.run) and callable(gyre.load_config)


@pytest.mark.parametrize("name", PACKAGES)
def test_all_names_exist_and_public_names_are_listed(name: str) -> None:
    module = importlib.import_module(name)
    exported = set(module.__all__)
    assert all(hasattr(module, n) for n in exported)
    public = {
        n for n, v in vars(module).items()
        if not n.startswith("_") and not isinstance(v, type(module)) and getattr(v, "__module__", "").startswith("gyre")
    }
    assert public <= exported, f"{name} exposes {sorted(public - exported)} outside __all__"
