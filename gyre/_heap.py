"""The garbage collector in gyre's long-lived processes: `freeze_startup_heap`, `thaw_heap`.

A node or cell process imports torch, transformers and (in a cell) vLLM: hundreds of thousands
of objects the collector tracks. CPython's full collection walks all of them and stops the event
loop meanwhile (a few tenths of a second: `docs/notes/engine-speed.md`), so every request in
flight through the proxy or the cell waits. vLLM freezes its engine core's and workers'
start-up heaps for the same reason (`vllm.utils.gc_utils.freeze_gc_heap`).
"""

from __future__ import annotations

import gc

__all__ = ["freeze_startup_heap", "thaw_heap"]


def freeze_startup_heap() -> int:
    """Collect, then move every object the collector tracks into its permanent generation
    (`gc.freeze`, Python 3.7+), so later collections walk only what the process allocated since.
    Call once, when start-up is done (imports, tokenizer, engine); objects frozen are still freed
    when their reference count drops to zero, only a cycle among them is never collected. Returns
    the number of objects frozen in all (`gc.get_freeze_count()`)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def thaw_heap() -> None:
    """Undo `freeze_startup_heap` (`gc.unfreeze`): the frozen objects join the oldest generation
    again, so a cycle among them can be collected. For a run that ends in a process that goes on
    (`gyre.run()` in a caller's process, a cell shutting its engine down)."""
    gc.unfreeze()
