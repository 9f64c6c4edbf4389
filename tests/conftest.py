"""Shared fixtures: anyio runs every async test on both backends (asyncio and trio)."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run each `pytest.mark.anyio` test once per backend (DESIGN.md: the node runs on both)."""
    return request.param
