"""`Counters`: the named counts a stateful object reports through its `statistics()` record.

Every name is declared when the counters are made and starts at 0; `counters[name] += n` counts,
and a name not declared raises `KeyError` (a typo fails instead of counting apart). `Counters` is
a mapping of name to count, so `Statistics(**counters, ...)` builds the frozen record
(docs/style.md rule 6). Knows nothing about the records or what is counted.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

__all__ = ["Counters"]


class Counters(Mapping[str, int]):
    """Integer counts under the names given, each from 0."""

    __slots__ = ("_counts",)

    def __init__(self, *names: str) -> None:
        """Raises `ValueError` for a name given twice."""
        if len(set(names)) != len(names):
            raise ValueError(f"names={names} repeats a name")
        self._counts = dict.fromkeys(names, 0)

    def __getitem__(self, name: str) -> int:
        return self._counts[name]

    def __setitem__(self, name: str, count: int) -> None:
        """Set a declared count (`+=` reads, then sets); `KeyError` for an undeclared name."""
        if name not in self._counts:
            raise KeyError(name)
        self._counts[name] = count

    def __iter__(self) -> Iterator[str]:
        return iter(self._counts)

    def __len__(self) -> int:
        return len(self._counts)

    def __repr__(self) -> str:
        return f"Counters({self._counts})"
