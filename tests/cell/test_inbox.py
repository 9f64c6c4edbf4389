"""The node's end of a cell's delta stream: merging a request's queued deltas (`merge_deltas`)
and its inbox (`DeltaInbox`: every queued frame per wake-up, errors typed, the deadline kept by
`expire_inboxes`)."""

from __future__ import annotations

import time

import anyio
import pytest

from gyre.cell.inbox import DeltaInbox, expire_inboxes
from gyre.cell.wire import Frame, WireError, merge_deltas
from gyre.engines.protocol import TokenDelta
from gyre.errors import ContextLengthError, EngineUnavailableError


def delta(index=0, ids=(), versions=None, finish=None, cached=None, top=False) -> TokenDelta:
    ids = list(ids)
    return TokenDelta(
        index=index,
        token_ids=ids,
        logprobs=[-0.5 - t for t in ids],
        versions=list(versions) if versions is not None else [0] * len(ids),
        finish_reason=finish,
        cached_tokens=cached,
        top_ids=[[t, t + 1] for t in ids] if top else None,
        top_logprobs=[[-0.5 - t, -9.0] for t in ids] if top else None,
    )


def test_consecutive_deltas_of_a_choice_merge_into_their_concatenation() -> None:
    got = merge_deltas(
        [
            delta(ids=[11, 12], versions=[3, 3]),
            delta(ids=[13], versions=[4]),  # a weight load between the two
            delta(ids=[], finish="length", cached=16),
        ]
    )
    assert got == [
        TokenDelta(
            index=0,
            token_ids=[11, 12, 13],
            logprobs=[-11.5, -12.5, -13.5],
            versions=[3, 3, 4],  # every token keeps the version that sampled it
            finish_reason="length",
            cached_tokens=16,
        )
    ]


def test_a_single_delta_is_returned_as_it_is_and_none_stays_none() -> None:
    one = delta(ids=[7])
    [got] = merge_deltas([one])
    assert got is one
    assert merge_deltas([]) == []


def test_choices_merge_apart_in_the_order_of_their_first_delta() -> None:
    got = merge_deltas(
        [delta(1, [20]), delta(0, [10]), delta(1, [21]), delta(0, [11], finish="stop")]
    )
    assert [(d.index, d.token_ids, d.finish_reason) for d in got] == [
        (1, [20, 21], None),
        (0, [10, 11], "stop"),
    ]


def test_no_merge_across_a_finish() -> None:
    # a choice's deltas after its finish (none come from an engine) start a new delta
    got = merge_deltas([delta(ids=[5], finish="abort"), delta(ids=[6]), delta(ids=[7])])
    assert [(d.token_ids, d.finish_reason) for d in got] == [([5], "abort"), ([6, 7], None)]


def test_top_logprobs_concatenate_token_by_token() -> None:
    [got] = merge_deltas(
        [delta(ids=[3], top=True), delta(ids=[4], top=True), delta(finish="length")]
    )
    assert got.top_ids == [[3, 4], [4, 5]]
    assert got.top_logprobs == [[-3.5, -9.0], [-4.5, -9.0]]
    assert len(got.top_ids) == len(got.token_ids)


pytestmark = pytest.mark.anyio


async def test_inbox_hands_every_queued_frame_merged_in_one_wake_up() -> None:
    inbox = DeltaInbox(time.monotonic() + 5)
    for t in (1, 2, 3):
        inbox.put(Frame(delta=delta(ids=[t], versions=[t]), tag=9))
    deltas, failure = await inbox.wait_deltas("r")
    assert failure is None
    assert [(d.token_ids, d.versions) for d in deltas] == [([1, 2, 3], [1, 2, 3])]


async def test_inbox_wakes_its_waiter_and_times_out_at_the_deadline() -> None:
    inboxes = {0: DeltaInbox(time.monotonic() + 0.2)}  # every request: the client's 0.2 s
    got = []

    async def consume(tag: int) -> None:
        try:
            got.append((tag, await inboxes[tag].wait_deltas("r")))
        except TimeoutError:
            got.append((tag, "timeout", time.monotonic() >= inboxes[tag].deadline))

    async with anyio.create_task_group() as tg:
        tg.start_soon(expire_inboxes, inboxes, 0.2)
        tg.start_soon(consume, 0)
        await anyio.sleep(0.01)
        inboxes[0].put(Frame(delta=delta(ids=[8]), tag=0))
        await anyio.sleep(0.01)
        assert got == [(0, ([delta(ids=[8])], None))]
        del inboxes[0]  # its request ended (the client drops it), as `generate` does
        # requests started one after the other, each with the client's timeout of 0.2 s
        for tag in (1, 2):
            inboxes[tag] = DeltaInbox(time.monotonic() + 0.2)
            tg.start_soon(consume, tag)
            await anyio.sleep(0.05)
        with anyio.fail_after(5):
            while len(got) < 3:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    # a late timer wakes both in one pass, and trio schedules woken tasks in random order
    assert sorted(got[1:]) == [(1, "timeout", True), (2, "timeout", True)]
    inbox = DeltaInbox(time.monotonic() - 1)
    inbox.put(Frame(delta=delta(ids=[9]), tag=0))
    with pytest.raises(TimeoutError):  # past its deadline even with a frame queued
        await inbox.wait_deltas("r")


async def test_inbox_errors_come_after_the_deltas_before_them_and_keep_their_type() -> None:
    inbox = DeltaInbox(time.monotonic() + 5)
    inbox.put(Frame(delta=delta(ids=[1]), tag=0))
    inbox.put(Frame(error=WireError(code=ContextLengthError.code, message="too long"), tag=0))
    inbox.put(Frame(delta=delta(ids=[2]), tag=0))  # after the error: dropped
    deltas, failure = await inbox.wait_deltas("r")
    assert [d.token_ids for d in deltas] == [[1]]
    assert isinstance(failure, ContextLengthError) and str(failure) == "too long"
    inbox.put(EngineUnavailableError("cell x lost the delta stream"))
    deltas, failure = await inbox.wait_deltas("exec/call-3")
    assert deltas == []
    assert isinstance(failure, EngineUnavailableError)
    assert str(failure) == "cell x lost the delta stream (request 'exec/call-3')"


async def test_a_frame_with_neither_a_delta_nor_an_error_is_refused_by_name() -> None:
    inbox = DeltaInbox(time.monotonic() + 5)
    inbox.put(Frame(delta=delta(ids=[1]), tag=0))
    inbox.put(Frame(tag=0))  # no delta, no error: never handed on as a None delta
    with pytest.raises(ValueError, match="frame of request 'exec/call-1' holds no delta"):
        await inbox.wait_deltas("exec/call-1")
