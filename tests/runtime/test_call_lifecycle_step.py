"""What a step trains equals what `--resume` rebuilds from the call log (field case B42): an agent
killed while its non-streamed call is generating leaves the call held for a client retry
(`proxy.retry_window_s`), and its execution ends; the execution's calls that `Rollout.run` hands
to the step are the calls the log holds for it, which `elastic_resume._recover` rebuilds, before
the retry window ends and after. Virtual time (trio's `MockClock`), a scripted engine."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
import trio.testing

from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from gyre.model.recipe import build_tokenizer
from gyre.rollout.harness import Rollout
from gyre.runtime.checkpoint import LedgerEntry
from gyre.runtime.elastic_resume import _recover
from gyre.tasks.outcome import Outcome, Score
from tests.tito.conftest import asgi_post, encode, make_proxy

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend(monkeypatch):
    """trio with a virtual clock: a sleep returns as soon as every task waits (no real time).
    Thread hops (the log's fsync) run inline: the clock would jump past every timer while a
    thread runs."""

    async def inline(fn, *args, **_):
        return fn(*args)

    monkeypatch.setattr(anyio.to_thread, "run_sync", inline)
    return "trio", {"clock": trio.testing.MockClock(autojump_threshold=0)}


class _Task:
    task_id = "t"

    class spec:  # noqa: N801 - the shape of `Task.spec.agent` the rollout reads
        class agent:  # noqa: N801
            max_turns = 0
            token_budget = 0


class _KilledAgent:
    """A harness whose agent sends one non-streamed call and is killed `killed_at_s` after it
    (its connection drops); the harness returns `ends_after_s` after the kill (timed out)."""

    def __init__(self, proxy, killed_at_s: float, ends_after_s: float) -> None:
        self.proxy, self.killed_at_s, self.ends_after_s = proxy, killed_at_s, ends_after_s
        self.status = 0

    async def run(self, task, execution_id: str, *, control, api_key: str) -> Outcome:
        body = {"model": "gyre", "messages": [{"role": "user", "content": "write"}]}
        path = "/v1/chat/completions"
        self.status, _ = await asgi_post(
            self.proxy, path, api_key, body, gone_after_s=self.killed_at_s
        )
        await anyio.sleep(self.ends_after_s)
        score = Score(passed=0, total=1, score=0.0, all_passed=False)
        return Outcome(
            execution_id=execution_id, task_id=task.task_id, termination="timeout", score=score
        )


@pytest.mark.parametrize(
    "ends_after_s", [1.0, 5.15, 7.0], ids=["in-the-window", "after-the-window", "after-expiry"]
)
async def test_b42_the_step_trains_the_calls_the_log_holds_when_an_agent_dies_mid_call(
    anyio_backend, tmp_path: Path, ends_after_s: float
):
    """The agent is killed 1.35 s into a call that samples a token every 0.1 s: 13 tokens. The
    call is held for `retry_window_s` (5 s, to 6.35 s). The execution ends 1 s after the kill,
    within the window (no retry can come now: it is recorded before the execution's end), 5.15 s
    after it (at 6.5 s: the window has ended, the expiry, every 1 s, has not recorded it yet) or
    7 s after it (the expiry recorded it at 7 s). Each way the step's calls, the log's and what a
    resumed run rebuilds are the same one aborted 13-token call."""
    tok = build_tokenizer()
    ids = encode(tok, " word" * 40)[:40]
    engine = ScriptedEngine(
        [ScriptedReply(token_ids=ids)], eos_token_id=tok.eos_token_id, token_delay_s=0.1
    )
    log_path = tmp_path / "calls.log"
    proxy = make_proxy(tok, engine, log_path=str(log_path), retry_window_s=5.0)
    agent = _KilledAgent(proxy, killed_at_s=1.35, ends_after_s=ends_after_s)
    rollout = Rollout(proxy, agent, max_concurrent=1)  # type: ignore[arg-type]
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(proxy.inflight.run_expiry)  # as `TitoProxy.serve` runs it
            executed = await rollout.run(_Task(), "b42")
            tg.cancel_scope.cancel()
    assert agent.status == 499  # the proxy saw the agent's connection drop
    entry = LedgerEntry(step=0, task_id="t", slot=0, outcome=executed.outcome, group=0)
    rebuilt = _recover(log_path, {(0, 0): entry})[(0, 0)]
    assert [(c.completion_ids, c.finish_reason) for c in executed.calls] == [(ids[:13], "abort")]
    assert rebuilt.calls == executed.calls
    assert rebuilt.summary == executed.summary and executed.summary.num_calls == 1
