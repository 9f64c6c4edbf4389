"""Suspension in the node runtime (`gyre.runtime.suspension`), the simulator's rule: a switch that
leaves executions no rollout cell with room suspends exactly those, their model calls wait (never
fail), they resume on the next rollout cell with room, and every call's tokens equal an
uninterrupted run's, each with the version that sampled it.

Colocate with partial rollouts (`max_staleness_steps=1`, streaming) on two cell doubles: the first
two groups to finish form step 1's batch and every cell switches to training while group 1, a
straggler, still runs, so both its members are suspended through the step and resume after it.
The executions are doubles that make `CALLS[k]` model calls through the router (`prefix_rule`:
the next token is a function of the prefix, like greedy sampling)."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from types import SimpleNamespace

import anyio

from gyre.config import config_from_dict
from gyre.engines.protocol import Completion, GenerateRequest, SamplingParams, collect
from gyre.engines.scripted import ScriptedEngine
from gyre.rollout.source import Executed
from gyre.routing.router import Router
from gyre.runtime.cell_handle import CellHandle
from gyre.runtime.elastic import ElasticRuntime
from gyre.runtime.mechanics import move_off, resume_suspended
from gyre.runtime.scheduler import ColocatePolicy
from gyre.tasks.task import Task, load_suite
from tests.routing.test_router import VOCAB, prefix_rule
from tests.runtime.fake_cells import Exchange, FakeTrainingCell, failed_execution
from tests.runtime.test_mechanics import BatchRecorder, TimedRollout

REPO = Path(__file__).resolve().parents[2]
B, G, STEPS, CAP = 4, 2, 3, 2
TOKENS = 8
"""Tokens of every model call."""
DELAY_S = 0.01
"""Seconds per token on the cell doubles."""
CALLS = [2, 2, 6, 6, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]
"""Model calls of execution k: group 1 (executions 2 and 3) straggles."""


def test_move_off_suspends_exactly_what_finds_no_room_and_resume_is_first_in_first_out() -> None:
    leaving = SimpleNamespace(index=0, role="rollout", executions={"a", "b", "c"})
    stays = SimpleNamespace(index=1, role="rollout", executions={"z"})
    suspended: deque[str] = deque()
    moved = []

    def move(e: str, c: SimpleNamespace) -> None:
        c.executions.add(e)
        moved.append((e, c.index))

    cells = [leaving, stays]
    move_off(
        sorted(leaving.executions),
        cells,
        capacity=2,
        avoid={0},
        move=move,
        suspend=suspended.append,
    )
    assert moved == [("a", 1)] and list(suspended) == ["b", "c"]  # cell 1 had one free slot
    leaving.role = "train"  # its switch went on: it takes nothing
    other = SimpleNamespace(index=2, role="rollout", executions={"y"})
    stays.executions.discard("z")  # one slot frees on cell 1, one is free on cell 2
    moved.clear()
    n = resume_suspended(suspended, [leaving, stays, other], capacity=2, resume=move)
    assert n == 2 and moved == [("b", 1), ("c", 2)] and not suspended  # least loaded each time
    suspended.extend(["d", "e", "f"])
    assert resume_suspended(suspended, [leaving, stays, other], capacity=2, resume=move) == 0
    assert list(suspended) == ["d", "e", "f"]  # cells 1 and 2 are full


def make_request(execution_id: str, k: int, call: int) -> GenerateRequest:
    return GenerateRequest(
        request_id=f"{execution_id}/c{call}",
        prompt_ids=[1 + k % 50, 1 + call],
        sampling=SamplingParams(max_tokens=TOKENS, temperature=0.0),
    )


class CallingRollout(TimedRollout):
    """Executions that make `CALLS[k]` model calls through the router and end failed (nothing to
    train); keeps every call's completion."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.calls: dict[str, list[Completion]] = {}

    async def run(self, task: Task, execution_id: str):  # noqa: ANN201
        k = int(execution_id[1 : execution_id.index("-")])
        engine = self.router.engine_for(execution_id)
        done = self.calls[execution_id] = []
        for call in range(CALLS[k]):
            done += await collect(engine, make_request(execution_id, k, call))
        self.calls[execution_id] = done
        return failed(task, execution_id)


def failed(task: Task, execution_id: str) -> Executed:
    return failed_execution(execution_id, task.task_id, "calling double")


async def run_colocate(tmp_path: Path):  # noqa: ANN201
    config = config_from_dict(
        {
            "run_dir": str(tmp_path),
            "seed": 1,
            "loop": {"steps": STEPS, "batch_executions": B, "group_size": G},
            "scheduler": {"capacity_per_cell": CAP, "streaming": True},
            "tasks": {"suites": [str(REPO / "examples/tasks/learnable")]},
        }
    )
    exchange = Exchange()
    fakes = [
        FakeTrainingCell(
            i,
            ScriptedEngine(rule=prefix_rule, vocab_size=VOCAB, token_delay_s=DELAY_S),
            exchange,
        )
        for i in range(2)
    ]
    cells = [CellHandle(name=f"cell-{i}", client=f) for i, f in enumerate(fakes)]
    journal = BatchRecorder()
    async with Router({c.name: c.client for c in cells}, config=config.router) as router:
        rollout = CallingRollout(router)
        runtime = ElasticRuntime(
            config=config,
            cells=cells,
            router=router,
            rollout=rollout,
            policy=ColocatePolicy(max_staleness_steps=1),
            tasks=load_suite(REPO / "examples/tasks/learnable"),
            snapshot="model",
            journal=journal,
        )
        seen = []  # (suspended, on cells, suspended count) at each decision
        decide = runtime._scheduler_state

        def watch():  # noqa: ANN202
            state = decide()
            running = {e for c in runtime.state.cells for e in c.executions}
            seen.append((tuple(runtime.state.suspension.queue), running, state.suspended))
            return state

        runtime._scheduler_state = watch
        await runtime.run(STEPS)
    return journal.steps, runtime.statistics(), rollout.calls, seen, router.statistics()


def test_a_switch_without_room_suspends_the_stragglers_and_they_resume_intact(
    tmp_path: Path,
) -> None:
    steps, stats, calls, seen, router = anyio.run(run_colocate, tmp_path)
    assert steps[0] == [0, 2] and len(steps) == STEPS  # group 1 straggled past step 1
    straggler_ids = {e for e in calls if e.startswith(("x2-", "x3-"))}
    assert len(straggler_ids) == 2
    queues = [q for q, _, _ in seen]
    i = next(i for i, q in enumerate(queues) if q)
    # every cell left rollout at once: exactly the executions on cells before the switch are
    # suspended, the stragglers among them
    assert set(queues[i]) == seen[i - 1][1] >= straggler_ids and not seen[i][1]
    assert all(n == len(q) for q, _, n in seen)  # the policy sees them (in the water level)
    events = sum(len(set(q) - set(p)) for p, q in zip([(), *queues], queues))
    # the last step's switch suspends what runs then; the run ends with them suspended
    assert stats.suspensions == events >= 4 and stats.suspended == len(queues[-1]) >= 1
    assert stats.resumptions == stats.suspensions - stats.suspended
    assert router.holds == stats.suspensions  # the router's count, which the step metrics read
    ended = {e for e, done in calls.items() if len(done) == CALLS[int(e[1 : e.index("-")])]}
    resumed = ended & {e for q in queues for e in q}
    assert resumed and not ended & set(queues[-1])
    for execution_id in ended:
        k = int(execution_id[1 : execution_id.index("-")])
        for call, completion in enumerate(calls[execution_id]):
            (expected,) = anyio.run(
                collect,
                ScriptedEngine(rule=prefix_rule, vocab_size=VOCAB),
                make_request(execution_id, k, call),
            )
            assert completion.token_ids == expected.token_ids, (execution_id, call)
            assert completion.logprobs == expected.logprobs
            assert completion.finish_reason == "length"
    # a resumed execution's tokens carry the versions that sampled them, in order: those from
    # before its suspension the older one (none if it had sampled nothing yet)
    spans = [[v for c in calls[e] for v in c.versions] for e in sorted(resumed)]
    assert all(v == sorted(v) for v in spans) and any(len(set(v)) >= 2 for v in spans)
    assert router.requests_redirected >= 1 and router.executions_held == len(queues[-1])
