"""`gyre._counters.Counters`: declared names from 0, `+=` counts, a record is built from them."""

from __future__ import annotations

import msgspec
import pytest

from gyre._counters import Counters


class _Stats(msgspec.Struct, frozen=True, kw_only=True):
    running: int
    requests_total: int
    tokens: int


def test_counts_start_at_zero_and_build_the_record() -> None:
    counts = Counters("requests_total", "tokens")
    assert dict(counts) == {"requests_total": 0, "tokens": 0} and len(counts) == 2
    counts["requests_total"] += 1
    counts["tokens"] += 7
    counts["tokens"] += True  # a flag counts as 1
    assert _Stats(running=3, **counts) == _Stats(running=3, requests_total=1, tokens=8)
    assert list(counts) == ["requests_total", "tokens"]


def test_an_undeclared_or_repeated_name_is_refused() -> None:
    counts = Counters("requests_total")
    with pytest.raises(KeyError):
        counts["request_total"] += 1
    with pytest.raises(KeyError):
        counts["tokens"] = 1
    assert dict(counts) == {"requests_total": 0}
    with pytest.raises(ValueError, match="repeats"):
        Counters("a", "b", "a")
