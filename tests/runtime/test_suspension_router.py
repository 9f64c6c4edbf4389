"""The router's half of suspension (`Router.hold`): a held execution's attempts stop with their
tokens kept, its requests wait unanswered (never failed), and everything continues on the cell
its next `pin` names, token for token what an uninterrupted run gives.

The cells are `ScriptedEngine`s under `prefix_rule` (the next token is a function of the prefix,
like greedy sampling), each with its own weight version, so a token's version names the cell
that sampled it (field case B11)."""

from __future__ import annotations

import anyio
import pytest

from gyre.config import RouterConfig
from gyre.errors import EngineTimeoutError
from gyre.routing import Router
from tests.routing.test_router import Consumer, reference, request, scripted, wait_until

pytestmark = pytest.mark.anyio


async def test_a_held_execution_waits_then_continues_on_its_next_cell() -> None:
    cells = {"a": scripted(1, delay_s=0.005), "b": scripted(2, delay_s=0.005)}
    req = request("x1/c1", [7, 8, 9], 40)
    later = request("x1/c2", [7, 8, 9, 10], 6)  # the agent's next call, made while held
    other = request("x2/c1", [4, 4], 6)  # another execution on the same cell is not held
    async with Router(cells, config=RouterConfig(no_cell_timeout_s=0.05)) as router:
        router.pin("x1", "a")
        router.pin("x2", "a")
        first, second, third = Consumer(), Consumer(), Consumer()
        async with anyio.create_task_group() as tg:
            tg.start_soon(first.run, router, req)
            await first.wait_tokens(10)
            assert router.hold("x1") == 1  # one attempt in flight, being stopped
            tg.start_soon(second.run, router, later)
            tg.start_soon(third.run, router, other)
            await third.finished.wait()
            # held well past no_cell_timeout_s: nothing fails, nothing streams
            stopped = len(first.tokens())
            held_from = anyio.current_time()
            await anyio.sleep(0.3)
            assert len(first.tokens()) == stopped and second.tokens() == []
            assert first.error is None and second.error is None and not second.finished.is_set()
            stats = router.statistics()
            assert stats.executions_held == 1 and stats.running_requests == 2
            assert {c.name: c.running for c in stats.cells} == {"a": 0, "b": 0}
            router.pin("x1", "b")
            held_s = anyio.current_time() - held_from
        stats = router.statistics()
    assert third.error is None and set(third.versions()) == {1}
    expected = (await reference(req))[0]
    assert first.tokens() == expected.token_ids and first.finish() == "length"
    # tokens sampled before the suspension carry cell a's version, those after cell b's
    assert first.versions() == [1] * stopped + [2] * (40 - stopped)
    assert 10 <= stopped < 40
    assert second.tokens() == (await reference(later))[0].token_ids
    assert set(second.versions()) == {2}
    assert stats.requests_redirected == 1 and stats.executions_held == 0
    # counted from the resume (to cell b's first token), not from the stop: less than the hold
    assert 0 < stats.redirect_latency_s_max < held_s
    assert {c.name: c.executions for c in stats.cells} == {"a": 1, "b": 1}


async def test_a_held_request_ends_at_its_own_deadline_or_its_callers_abort() -> None:
    cells = {"a": scripted(1, delay_s=0.005)}
    config = RouterConfig(no_cell_timeout_s=0.05, request_timeout_s=0.4)
    async with Router(cells, config=config) as router:
        router.pin("x1", "a")
        router.hold("x1")
        waiting = Consumer()
        with anyio.fail_after(5):
            await waiting.run(router, request("x1/c1", [1, 2], 8))
        assert isinstance(waiting.error, EngineTimeoutError)
        assert "request_timeout_s=0.4" in str(waiting.error)
        # the caller aborts a held request: its tokens so far come back, finish `abort`
        streaming = Consumer()
        router.pin("x1", "a")
        async with anyio.create_task_group() as tg:
            tg.start_soon(streaming.run, router, request("x1/c2", [3, 4], 30))
            await streaming.wait_tokens(5)
            router.hold("x1")
            await wait_until(lambda: router.statistics().cells[0].running == 0)
            kept = streaming.tokens()
            (done,) = await router.abort("x1/c2")
        assert done.finish_reason == "abort" and done.token_ids == kept and len(kept) >= 5
        assert streaming.finish() == "abort" and streaming.error is None
        router.end_execution("x1")
        assert router.statistics().executions_held == 0


async def test_a_held_execution_past_its_deadline_is_stopped_and_partially_scored(
    tmp_path,  # noqa: ANN001
) -> None:
    """The coin agent through the real proxy and harness: its execution is held once its first
    call is recorded, so its second call (in flight or not yet sent) waits until the agent's
    deadline stops it; the execution ends `timeout` with a partial score, and the held request is
    abandoned, not failed."""
    from pathlib import Path

    import msgspec

    from gyre.config import config_from_dict
    from gyre.engines.scripted import ScriptedEngine
    from gyre.model.recipe import build_tokenizer
    from gyre.rollout.sources import open_rollout
    from gyre.tasks.task import load_suite

    repo = Path(__file__).resolve().parents[2]
    suite = repo / "examples/tasks/learnable"
    agent = Path(__file__).with_name("coin_agent.py")
    config = config_from_dict(
        {
            "run_dir": str(tmp_path),
            "tasks": {"suites": [str(suite)], "harness": {"agent_command": ["python", str(agent)]}},
        }
    )
    task = load_suite(suite)[0]
    spec = task.spec
    agent_limits = msgspec.structs.replace(spec.agent, deadline_s=8.0)
    task = msgspec.structs.replace(task, spec=msgspec.structs.replace(spec, agent=agent_limits))
    tok = build_tokenizer()
    cell = ScriptedEngine(
        eos_token_id=tok.eos_token_id, vocab_size=len(tok), max_model_len=4096, token_delay_s=0.2
    )
    async with Router({"a": cell}, config=config.router) as router:
        async with open_rollout(
            config, tokenizer=tok, engine_for=router.engine_for, max_concurrent=1
        ) as rollout:
            eid = "x0-L-t0-g1"
            router.pin(eid, "a")
            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    done = {}

                    async def run() -> None:
                        done["executed"] = await rollout.run(task, eid)

                    tg.start_soon(run)

                    def one_call() -> bool:
                        try:
                            return rollout.proxy.summary(eid).num_calls == 1
                        except KeyError:  # its key is not minted yet
                            return False

                    await wait_until(one_call)
                    router.hold(eid)
            executed = done["executed"]
        stats = router.statistics()
    outcome = executed.outcome
    assert outcome.termination == "timeout", outcome
    assert outcome.score is not None
    assert outcome.score.passed == 0  # the odd slot would have solved it after its second call
    assert len(executed.calls) == 1 and stats.requests_total == 2
    assert stats.requests_abandoned == 1  # the held call: stopped with its agent, not failed
    assert stats.running_requests == 0 and stats.executions_held == 1
