"""The public API of gyre.tasks and gyre.agents is what their `__all__` says."""

from __future__ import annotations

import importlib

import pytest


@pytest.mark.parametrize("name", ["gyre.tasks", "gyre.agents"])
def test_all_is_the_public_api(name: str) -> None:
    module = importlib.import_module(name)
    public = {n for n in dir(module) if not n.startswith("_") and not isinstance(getattr(module, n), type(module))}
    public.discard("annotations")
    assert set(module.__all__) == public
    for n in module.__all__:
        assert getattr(module, n) is not None
