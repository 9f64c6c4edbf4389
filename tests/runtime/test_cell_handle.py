"""`confirm_death`: a failed call is a cell's death only once the death is seen (a worker host's
cells are seen dead when the head notices the worker's connection end, after a call to one of
them may already have failed: the multi-host kill test stopped on such a switch)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import anyio

from gyre.runtime.cell_handle import confirm_death


class Exits:
    """A process-like whose `poll()` reports exit code -9 from `after_s` seconds on."""

    def __init__(self, after_s: float) -> None:
        self.at = time.monotonic() + after_s
        self.polls = 0

    def poll(self) -> int | None:
        self.polls += 1
        return -9 if time.monotonic() >= self.at else None


def test_a_death_seen_within_the_grace_confirms_it_and_none_does_not() -> None:
    late = SimpleNamespace(process=Exits(0.3))
    assert anyio.run(confirm_death, late, 2.0)  # seen 0.3 s after the failed call
    alive = SimpleNamespace(process=Exits(60.0))
    assert not anyio.run(confirm_death, alive, 0.2)  # a live cell's own error: raised
    assert alive.process.polls > 2  # it kept looking through the grace, not once
    assert not anyio.run(confirm_death, SimpleNamespace(process=None), 0.1)  # no process to watch
