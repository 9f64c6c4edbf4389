"""`gyre._mailbox.Mailbox`: every queued item per wake-up, in order; close and wake end a wait."""

from __future__ import annotations

import anyio
import pytest

from gyre._mailbox import Mailbox

pytestmark = pytest.mark.anyio


async def test_a_wait_returns_every_item_queued_and_close_or_wake_end_it() -> None:
    box: Mailbox[int] = Mailbox()
    got: list[list[int]] = []

    async def consume() -> None:
        await box.wait()
        got.append(box.take())

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await anyio.sleep(0.01)
        assert got == []  # nothing queued: it waits
        box.put(1)
        box.put(2)  # before the consumer runs: both in one take
    assert got == [[1, 2]] and len(box) == 0 and box.take() == []
    for end in (box.wake, box.close):  # an empty wake-up: a deadline passed; then no more items
        got.clear()
        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await anyio.sleep(0.01)
            end()
        assert got == [[]]
    assert box.closed
    await box.wait()  # closed: returns at once
