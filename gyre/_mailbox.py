"""`Mailbox`: items handed from producers to one waiting consumer within one event loop.

A plain list and one `anyio.Event` per wait. An anyio memory stream builds a task record on every
blocking `receive` (its cost: `docs/notes/engine-speed.md`), and its consumer takes one item per
wake-up; here `put` never blocks and the consumer takes every item queued at each wake-up. Used
by the cell client's per-request inboxes and request poster (`gyre.cell.inbox`) and by the
proxy's engine hand-off (`gyre.tito.generation`). Knows nothing about what the items are.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import anyio

__all__ = ["Mailbox"]

T = TypeVar("T")


class Mailbox(Generic[T]):
    """Items not yet taken, whether it is closed, and the wake-up its one consumer waits on."""

    __slots__ = ("_items", "closed", "_wake")

    def __init__(self) -> None:
        self._items: list[T] = []
        self.closed = False
        """No more items will come (`close`)."""
        self._wake: anyio.Event | None = None

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: T) -> None:
        """Queue `item` and wake the consumer; never blocks."""
        self._items.append(item)
        self.wake()

    def close(self) -> None:
        """Mark that no more items will come and wake the consumer."""
        self.closed = True
        self.wake()

    def wake(self) -> None:
        """Wake the consumer if it waits (also without an item: a deadline passed)."""
        if self._wake is not None:
            self._wake.set()
            self._wake = None

    async def wait(self) -> None:
        """Return at once when an item is queued or the mailbox is closed; else at the next
        `put`, `close` or `wake`."""
        if not self._items and not self.closed:
            self._wake = anyio.Event()
            await self._wake.wait()

    def take(self) -> list[T]:
        """Every item queued, in order (none: [])."""
        items, self._items = self._items, []
        return items
