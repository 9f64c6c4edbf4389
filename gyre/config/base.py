"""The base of every config Struct, and reading a TOML file as one.

Owns `Config` (frozen, keyword-only, unknown keys rejected), `check_positive` (the shared
`ValueError(f"{field=} ...")` check), `validation_message` (msgspec's error with the key path of
the field a check names) and `load_toml` (one `ConfigError` line: file, key path, value). Used by
`gyre.config`'s components and by `gyre.sim`'s own configs; knows no component.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TypeVar

import msgspec

from gyre.errors import ConfigError

__all__ = ["Config", "check_positive", "validation_message", "load_toml"]

T = TypeVar("T")


class Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base: frozen, keyword-only, unknown keys rejected."""


def check_positive(**fields: float) -> None:
    """Raise `ValueError` naming the first field whose value is not > 0 (NaN included)."""
    for name, value in fields.items():
        if not value > 0:  # NaN fails too
            raise ValueError(f"{name}={value!r} must be > 0")


_FIELD_CHECK = re.compile(
    r"(?P<field>[a-z_][a-z0-9_]*)(?P<sep>[=:])(?P<rest>.*?)(?: - at `(?P<at>\$[\w.]*)`)?"
)
"""A struct's own check (`field=value must ...`, `field: ...`) as msgspec reports it."""


def _struct_type(type_: object) -> type[msgspec.Struct] | None:
    """`type_` if it is a Struct class, else None."""
    return type_ if isinstance(type_, type) and issubclass(type_, msgspec.Struct) else None


def validation_message(exc: msgspec.ValidationError, type_: type) -> str:
    """`exc`'s message, with the key path of the field a struct's own check names.

    msgspec reports an error raised in `__post_init__` at the struct's path
    (`num_cells=-1 must be > 0 - at $.cells`; no path for `type_` itself); when the message
    starts with one of that struct's fields (`field=...` or `field: ...`), the path is extended
    to the field (`- at $.cells.num_cells`), as msgspec's own type errors give it. Any other
    message is returned as it is."""
    message = str(exc)
    match = _FIELD_CHECK.fullmatch(message)
    if match is None:
        return message
    at = match["at"] or "$"
    struct = _struct_type(type_)
    for name in at.split(".")[1:]:
        if struct is None:
            break
        fields = {f.name: f.type for f in msgspec.structs.fields(struct)}
        struct = _struct_type(fields.get(name))
    if struct is None:
        return message  # a path through a list, dict or union: left as msgspec gave it
    field = match["field"]
    if field not in struct.__struct_fields__:
        return message
    return f"{field}{match['sep']}{match['rest']} - at `{at}.{field}`"


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
        raise ConfigError(f"{path}: {validation_message(exc, type_)}") from None
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
