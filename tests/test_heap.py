"""`gyre._heap.freeze_startup_heap`, in a fresh interpreter (freezing pytest's own heap would
outlive the test)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import gc
from gyre._heap import freeze_startup_heap, thaw_heap

before = [[]]                  # a container the collector tracks
n = freeze_startup_heap()
after = [[]]
tracked = {id(o) for o in gc.get_objects()}
print(n == gc.get_freeze_count(), n > 1000, id(before) in tracked, id(after) in tracked)
thaw_heap()
print(gc.get_freeze_count(), id(before) in {id(o) for o in gc.get_objects()})
"""


def test_objects_alive_at_the_freeze_leave_the_collected_generations_until_thawed() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    # the count is the permanent generation's; what existed is no longer walked, what came after
    # is; thawed, nothing is frozen and the first object is walked again
    assert out == ["True", "True", "False", "True", "0", "True"]
