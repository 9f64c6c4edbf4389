"""The base of every config Struct, and reading a TOML file as one.

Owns `Config` (frozen, keyword-only, unknown keys rejected), `check_positive` (the shared
`ValueError(f"{field=} ...")` check) and `load_toml` (one `ConfigError` line: file, key path,
value). Used by `gyre.config`'s components and by `gyre.sim`'s own configs; knows no component.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

import msgspec

from gyre.errors import ConfigError

__all__ = ["Config", "check_positive", "load_toml"]

T = TypeVar("T")


class Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base: frozen, keyword-only, unknown keys rejected."""


def check_positive(**fields: float) -> None:
    """Raise `ValueError` naming the first field whose value is not > 0 (NaN included)."""
    for name, value in fields.items():
        if not value > 0:  # NaN fails too
            raise ValueError(f"{name}={value!r} must be > 0")


def load_toml(path: str | os.PathLike[str], type_: type[T]) -> T:
    """Read a TOML file as the config Struct `type_` (also used by `gyre.sim`'s own configs).

    Raises `ConfigError` (one line: file, key path, value)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config {str(path)!r}: {exc.strerror}") from None
    try:
        return msgspec.toml.decode(raw, type=type_)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
