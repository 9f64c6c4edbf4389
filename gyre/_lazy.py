"""Lazy package exports (PEP 562): a package names its public API without importing it.

Every execution starts a fresh agent process (`python -m gyre.agents.react`), and the verifier and
the tools import `gyre` subpackages too. Importing `gyre` eagerly pulled in the runtime and torch:
1.4 s of the agent's 2.0 s start on this machine, paid 24 times a step on 2 cores.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module `__getattr__` and `__dir__` of `package` for `exports` (public name -> module).

    The first access of a name imports its module and caches the value in the package's namespace,
    so later accesses are plain attribute lookups. Raises AttributeError for a name not exported."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(importlib.import_module(package), name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(importlib.import_module(package))) | set(exports))

    return __getattr__, __dir__
