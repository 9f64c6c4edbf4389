"""One call lifecycle (docs/design.md, "One call lifecycle"): a client's retry of a call it timed
out on is served and recorded once (field case B41), streamed or not, and, over random
interleavings of timeouts, retries, disconnects, agent kills and execution ends, every logical
call is recorded at most once and what a step takes equals what the log holds. Virtual time
(trio's `MockClock`), scripted engines."""

from __future__ import annotations

import json
import math
import random
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
import trio.testing

from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from gyre.rollout.harness import Rollout
from gyre.tasks.outcome import Outcome, Score
from gyre.tito.log import CallEntry, read_log
from gyre.tito.records import ExecutionTokens
from tests.tito.conftest import asgi_post, encode, make_proxy, request_scope
from tests.tito.test_inflight import frames

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"


@pytest.fixture
def anyio_backend(monkeypatch):
    """trio with a virtual clock: a sleep returns as soon as every task waits (no real time).
    Thread hops (the log's fsync) run inline: the clock would jump past every timer while a
    thread runs."""

    async def inline(fn, *args, **_):
        return fn(*args)

    monkeypatch.setattr(anyio.to_thread, "run_sync", inline)
    return "trio", {"clock": trio.testing.MockClock(autojump_threshold=0)}


class StalledEngine(ScriptedEngine):
    """A stalled (slow) engine: a token every `token_delay_s`, and an abort that takes `abort_s`
    (the round trip to a cell) before it stops the request; its EOS comes `eos_after_s` later
    than the other tokens would."""

    def __init__(self, *args, abort_s: float = 0.0, eos_after_s: float = 0.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.abort_s, self.eos_after_s = abort_s, eos_after_s

    async def generate(self, request):
        async for delta in super().generate(request):
            if self.eos_after_s and self.eos_token_id in delta.token_ids:
                await anyio.sleep(self.eos_after_s)
            yield delta

    async def abort(self, request_id: str):
        with anyio.CancelScope(shield=True):
            await anyio.sleep(self.abort_s)
        return await super().abort(request_id)


def body(stream: bool, content: str = "write") -> dict:
    return {"model": "gyre", "messages": [{"role": "user", "content": content}], "stream": stream}


def token_ids(raw: bytes, stream: bool) -> list[int]:
    """The completion token IDs a response carried (gyre's `token_ids` field), whole or as SSE."""
    if not stream:
        return json.loads(raw)["choices"][0]["token_ids"]
    out = []
    for line in raw.decode().splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                out += choice["token_ids"]
    return out


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_b41_a_retry_of_a_timed_out_call_is_served_fresh_and_recorded_once(
    tok, anyio_backend, tmp_path: Path, stream: bool
):
    """B41: the client times out after 1 s and sends the same body again at once, while the proxy
    is still aborting the first call (the engine's abort takes 0.1 s). The retry must not join the
    dying call: it is served as a fresh call (200, every token), and the log holds exactly one
    record of the logical call, the retry's; the first call's partial sample is dropped."""
    ids = encode(tok, " word" * 20)[:20] + [tok.eos_token_id]
    engine = StalledEngine(
        [ScriptedReply(token_ids=ids), ScriptedReply(token_ids=ids)],
        eos_token_id=tok.eos_token_id,
        token_delay_s=0.2,
        abort_s=0.1,
    )
    proxy = make_proxy(tok, engine, log_path=str(tmp_path / "calls.log"))
    key = proxy.mint_key("b41")
    out = {}
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:

            async def first() -> None:
                out["first"] = await asgi_post(proxy, CHAT, key, body(stream), gone_after_s=1.0)

            tg.start_soon(first)
            await anyio.sleep(1.0)  # the client's timeout; the proxy sees it leave
            while proxy.statistics().disconnect_aborts < 1:
                await anyio.sleep(0.001)
            out["retry"] = await asgi_post(proxy, CHAT, key, body(stream))
        summary = await proxy.close("b41")
    status, raw = out["retry"]
    assert status == 200, raw
    assert token_ids(raw, stream) == ids
    stats = proxy.statistics()
    assert (stats.disconnect_aborts, stats.retries_joined) == (1, 0)  # aborted, never joined
    assert len(engine.requests_seen) == 2  # the retry ran as a fresh call
    entries = [e for e in frames(tmp_path / "calls.log") if isinstance(e, CallEntry)]
    assert [(e.call.completion_ids, e.call.finish_reason) for e in entries] == [(ids, "stop")]
    assert summary.num_calls == 1
    assert read_log(tmp_path / "calls.log").for_execution("b41") == [e.call for e in entries]


# -- the property: random interleavings ----------------------------------------------------------

SEEDS = 120
"""Schedules tried (each a few executions of up to 5 logical calls)."""
GRID_S = 1 / 64
"""Every time of a schedule is a multiple of this (binary fractions add exactly): events tie
often, and trio runs tied tasks in random order. An answer alone ends off the grid
(`StalledEngine.eos_after_s`): a client that leaves at the very instant its answer is written
has a complete call recorded and retries it as a new request, which no proxy can tell from a
second call without an `Idempotency-Key`."""


@dataclass
class Attempt:
    """One HTTP request of a logical call, as the client and as the server saw it."""

    stream: bool
    leave_at: float = math.inf
    """When the client's timeout fires (the event loop's clock): its connection drops then."""
    gave_up: anyio.Event = field(default_factory=anyio.Event, repr=False)
    """Set when the client leaves (its timeout, its agent killed): it reads nothing more."""
    left: bool = False
    """The server was told the client left (it reads nothing from then on)."""
    answered: anyio.Event = field(default_factory=anyio.Event, repr=False)
    """Set when the client has read an answer to its end (any status)."""
    status: int = 0
    """The status the server sent (0: none), whether or not the client still read it."""
    read_status: int = 0
    """The status the client read (0: it had left)."""
    seen: bytes = b""
    """What the client read before it left."""
    returned: bool = False
    mute: bool = False
    """The app returned without an answer to a client still there (an ASGI server sends 500)."""
    end_began: bool = False
    """The execution's end had begun when the server answered."""


@dataclass
class Logical:
    """One logical call of an agent: attempts of the same request (a body of its own)."""

    index: int
    stream: bool
    idempotency_key: str | None
    timeout_s: float
    attempts: int
    backoff_s: float
    sent: list[Attempt] = field(default_factory=list)
    answer: list[int] | None = None
    """The completion token IDs the client read in a whole answer (None: it got none)."""


@dataclass
class Plan:
    """An agent's schedule: lanes of logical calls (parallel sub-agents), and when it is killed."""

    lanes: list[list[Logical]]
    kill_at_s: float
    """When the agent is killed (inf: never; it ends when its lanes are done)."""
    notice_lag_s: float
    """How late the proxy sees the killed agent's connections drop."""
    end_after_s: float
    """How long after the agent stops its execution ends."""
    ending: anyio.Event = field(default_factory=anyio.Event, repr=False)
    """Set when its execution's end begins."""


class _Task:
    task_id = "t"

    class spec:  # noqa: N801 - the shape of `Task.spec.agent` the rollout reads
        class agent:  # noqa: N801
            max_turns = 0
            token_budget = 0


def plan_agent(rng: random.Random, retry_window_s: float, token_s: float) -> Plan:
    """Retries back off less than half `retry_window_s` (any backoff when it is 0); some
    timeouts are a whole number of tokens (`token_s` each): they tie with a token."""

    def grid(most_s: float) -> float:
        return rng.randint(0, int(most_s / GRID_S)) * GRID_S

    most_s = retry_window_s / 2 if retry_window_s else 1.5
    calls = [
        Logical(
            index=i,
            stream=rng.random() < 0.5,
            idempotency_key=f"k{i}" if rng.random() < 0.3 else None,
            timeout_s=rng.choice(
                [math.inf, GRID_S + grid(2.5), GRID_S + grid(0.6), token_s * rng.randint(1, 8)]
            ),
            attempts=rng.randint(1, 3),
            backoff_s=rng.choice([0.0, grid(min(1.5, most_s))]),
        )
        for i in range(rng.randint(1, 5))
    ]
    split = rng.randint(0, len(calls))
    return Plan(
        lanes=[calls[:split], calls[split:]],
        kill_at_s=rng.choice([math.inf, grid(4.0)]),
        notice_lag_s=rng.choice([0.0, grid(0.5)]),
        end_after_s=rng.choice([0.0, grid(2.0)]),
    )


async def wait_any(*events: anyio.Event) -> None:
    async with anyio.create_task_group() as tg:
        for event in events:

            async def wait(event: anyio.Event = event) -> None:
                await event.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(wait)


def request_of(eid: str, call: Logical, key: str, retry: int) -> tuple[dict, bytes]:
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    if call.idempotency_key is not None:
        headers["idempotency-key"] = call.idempotency_key
    if retry:
        headers["x-stainless-retry-count"] = str(retry)
    content = f"{eid} call {call.index}"
    raw = json.dumps(body(call.stream, content)).encode()
    scope = request_scope(CHAT, key)
    scope["headers"] = [(k.encode(), v.encode()) for k, v in headers.items()]
    return scope, raw


class ScheduleAgents:
    """The harness of the property: each execution's agent runs its `Plan` against the proxy's
    ASGI app (no sockets), in the test's task group so its requests outlive a kill."""

    def __init__(self, proxy, plans: dict[str, Plan], tg) -> None:
        self.proxy, self.plans, self.tg = proxy, plans, tg

    async def run(self, task, execution_id: str, *, control, api_key: str) -> Outcome:
        plan = self.plans[execution_id]
        killed = anyio.Event()
        lanes_done = [anyio.Event() for _ in plan.lanes]
        for lane, done in zip(plan.lanes, lanes_done):
            self.tg.start_soon(self._lane, execution_id, api_key, plan, lane, killed, done)
        with anyio.move_on_after(plan.kill_at_s):
            for done in lanes_done:
                await done.wait()
        killed.set()
        await anyio.sleep(plan.end_after_s)
        plan.ending.set()
        score = Score(passed=0, total=1, score=0.0, all_passed=False)
        return Outcome(
            execution_id=execution_id, task_id=task.task_id, termination="finished", score=score
        )

    async def _lane(self, eid, key, plan: Plan, lane: list[Logical], killed, done) -> None:
        try:
            for call in lane:
                for retry in range(call.attempts):
                    if killed.is_set():
                        return
                    attempt = Attempt(stream=call.stream)
                    attempt.leave_at = anyio.current_time() + call.timeout_s
                    call.sent.append(attempt)
                    self.tg.start_soon(self._send, eid, call, key, retry, attempt, plan)
                    with anyio.move_on_after(call.timeout_s):
                        await wait_any(attempt.answered, killed)
                    if attempt.answered.is_set():
                        if attempt.read_status == 200 and whole(attempt.seen, call.stream):
                            call.answer = token_ids(attempt.seen, call.stream)
                            break
                        continue  # an error: the client tries again (if it has tries left)
                    if killed.is_set():  # the agent's connections drop; the proxy sees it late
                        self.tg.start_soon(self._drop_after, plan.notice_lag_s, attempt)
                        return
                    attempt.gave_up.set()  # the client's timeout
                    await anyio.sleep(call.backoff_s)
        finally:
            done.set()

    @staticmethod
    async def _drop_after(lag_s: float, attempt: Attempt) -> None:
        await anyio.sleep(lag_s)
        attempt.gave_up.set()

    async def _send(self, eid, call: Logical, key, retry, attempt: Attempt, plan: Plan) -> None:
        scope, raw = request_of(eid, call, key, retry)
        sent = False
        seen: list[bytes] = []

        async def receive():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": raw, "more_body": False}
            # its own timer, as a socket's: the server may see it in the same tick as a token
            with anyio.move_on_after(attempt.leave_at - anyio.current_time()):
                await attempt.gave_up.wait()
            attempt.left = True
            return {"type": "http.disconnect"}

        async def send(message):
            if message["type"] == "http.response.start":
                attempt.status = message["status"]
                attempt.end_began = plan.ending.is_set()
            if attempt.left or attempt.gave_up.is_set():
                return  # the client left: nobody reads this
            if message["type"] == "http.response.start":
                attempt.read_status = message["status"]
            seen.append(message.get("body", b""))
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                attempt.seen = b"".join(seen)
                attempt.answered.set()

        await self.proxy.app(scope, receive, send)
        attempt.returned = True
        attempt.mute = attempt.status == 0 and not (attempt.left or attempt.gave_up.is_set())


def whole(raw: bytes, stream: bool) -> bool:
    """Whether a 200 answer is whole: a plain body, or a stream that gave its finish and ended."""
    if not stream:
        return True
    return b"data: [DONE]" in raw and b'"finish_reason":"' in raw


def word_rule(word: int):
    """The engine's replies: 2-13 copies of `word` (then EOS), by prompt."""

    def rule(request, index, vocab_size):
        n = 2 + zlib.crc32(bytes(str(request.prompt_ids), "ascii")) % 12
        return ScriptedReply(token_ids=[word] * n)

    return rule


async def run_schedule(tok, run_dir: Path, seed: int) -> None:
    rng = random.Random(seed)
    (word,) = encode(tok, " word")
    token_s = rng.choice([1 / 16, 1 / 8, 1 / 4])
    engine = StalledEngine(
        rule=word_rule(word),
        eos_token_id=tok.eos_token_id,
        token_delay_s=token_s,
        abort_s=rng.choice([0.0, 1 / 16, 1 / 4]),
        eos_after_s=0.0123,  # off the grid
    )
    log_path = run_dir / "calls.log"
    window_s = rng.choice([0.0, 0.5, 3.0, 30.0])
    proxy = make_proxy(
        tok, engine, log_path=str(log_path), retry_window_s=window_s, render_check_every=0
    )
    plans = {f"e{i}": plan_agent(rng, window_s, token_s) for i in range(rng.randint(1, 3))}
    events = watch_lifecycle(tok, proxy)
    executed = {}
    with anyio.fail_after(10_000):
        async with anyio.create_task_group() as tg:
            tg.start_soon(proxy.inflight.run_expiry)
            agents = ScheduleAgents(proxy, plans, tg)
            rollout = Rollout(proxy, agents, max_concurrent=len(plans))  # type: ignore[arg-type]

            async def execution(eid: str) -> None:
                executed[eid] = await rollout.run(_Task(), eid)

            async with anyio.create_task_group() as runs:
                for eid in plans:
                    runs.start_soon(execution, eid)
            while not all(a.returned for p in plans.values() for c in calls_of(p) for a in c.sent):
                await anyio.sleep(0.1)
            tg.cancel_scope.cancel()
    check_schedule(tok, seed, plans, executed, log_path, proxy, events)


def watch_lifecycle(tok, proxy) -> list[list]:
    """[kind, execution, logical call index] in the order the proxy did them: "begin" when a
    request began, "write" when a call's records began to be written (a call's write that wrote
    nothing, its execution sealed, is taken out again)."""
    events: list[list] = []
    begin, write = proxy._begin, proxy.recorder.write

    def begin_watched(request, ex, role, raw):
        ticket = begin(request, ex, role, raw)
        content = json.loads(raw)["messages"][0]["content"]
        events.append(["begin", ex.execution_id, int(content.rsplit(" ", 1)[1])])
        return ticket

    async def write_watched(call, replies):
        index = int(re.search(r"call (\d+)", tok.decode(call.rendered.prompt_ids)).group(1))
        event = ["write", call.execution.execution_id, index]
        events.append(event)
        written = await write(call, replies)
        if not written:
            events.remove(event)
        return written

    proxy._begin, proxy.recorder.write = begin_watched, write_watched
    return events


def calls_of(plan: Plan) -> list[Logical]:
    return [call for lane in plan.lanes for call in lane]


def check_schedule(tok, seed, plans, executed, log_path: Path, proxy, events) -> None:
    where = f"seed {seed} (retry_window_s={proxy.inflight.retry_window_s})"
    log = read_log(log_path)
    entries = frames(log_path)
    ended: set[str] = set()
    for e in entries:  # no record of an execution after its end entry; one end entry each
        eid = e.call.execution_id if isinstance(e, CallEntry) else e.summary.execution_id
        assert eid not in ended, f"{where}: an entry of {eid} after its end entry"
        if not isinstance(e, CallEntry):
            ended.add(eid)
    assert ended == set(plans), where
    for eid, plan in plans.items():
        calls = executed[eid].calls
        assert calls == log.for_execution(eid), f"{where}: {eid}: the step's calls != the log's"
        assert executed[eid].summary == log.summaries[eid], where
        assert executed[eid].summary.num_calls == len(calls), where
        by_logical: dict[int, list] = {}
        for full in ExecutionTokens(calls).full_calls():
            index = int(re.search(r"call (\d+)", tok.decode(full.prompt_ids)).group(1))
            by_logical.setdefault(index, []).append(full)
        for call in calls_of(plan):
            records = by_logical.get(call.index, [])
            what = f"{where}: {eid} call {call.index} ({call})"
            # Recorded at most once: every retry here begins within the retry window. With no
            # window (0 s: recorded at once), a retry that begins after a record is a new
            # logical call, and none is recorded twice.
            mine = [kind for kind, e, index in events if (e, index) == (eid, call.index)]
            assert mine.count("write") == len(records), what
            if proxy.inflight.retry_window_s > 0:
                assert len(records) <= 1, f"{what}: recorded {len(records)} times: {mine}"
            twice = [i for i in range(1, len(mine)) if mine[i - 1] == mine[i] == "write"]
            assert not twice, f"{what}: recorded twice for one request: {mine}"
            if call.answer is not None:  # the client read a whole answer: it is recorded
                assert (call.answer, "stop") in [
                    (r.completion_ids, r.finish_reason) for r in records
                ], what
            for attempt in call.sent:
                status = attempt.status
                assert status < 500 and not attempt.mute, f"{what}: status {status}"
                if not attempt.gave_up.is_set():  # a client still reading gets an answer
                    assert attempt.read_status, f"{what}: no answer"
                if attempt.read_status:  # and never a 499, nor a 409 before the end
                    assert status in (200, 401, 409), f"{what}: status {status}"
                    assert status == 200 or attempt.end_began, f"{what}: status {status}"
    stats = proxy.statistics()
    assert (stats.in_flight, stats.held, stats.open_executions) == (0, 0, 0), where


async def test_every_logical_call_is_recorded_at_most_once_whatever_the_interleaving(
    tok, anyio_backend, tmp_path: Path
):
    """The property over random schedules of agents (seeded): client timeouts and retries (the
    same body; some with an `Idempotency-Key`), parallel requests of one execution, agents killed
    mid-call whose connections the proxy sees drop late, executions ended at once or later, a
    stalled engine with slow aborts, retry windows of 0 to 30 s. For each: a logical call is
    recorded at most once, and exactly once, as the client read it, when it read a whole answer;
    the calls a step takes (`Rollout.run`) are the log's for that execution (what `--resume`
    rebuilds), none after its end entry; no 5xx, and a client still waiting never gets a 499
    (the symptom of a retry joined to an aborted call) nor a 409 before its execution ends."""
    for seed in range(SEEDS):
        run_dir = tmp_path / f"seed{seed}"
        run_dir.mkdir()
        await run_schedule(tok, run_dir, seed)
