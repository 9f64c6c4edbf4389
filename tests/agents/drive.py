"""Test helpers: run the reference agent on a task against the scripted server, oracle-driven."""

from __future__ import annotations

import msgspec

from gyre.agents.control import ExecutionControl, mint_api_key
from gyre.agents.harness import Harness
from gyre.agents.oracle import oracle_reply
from gyre.tasks.outcome import Outcome
from gyre.tasks.solution import load_solution
from gyre.tasks.task import Task
from tests.agents.openai_server import HANG, ControlBridge, ScriptedOpenAI

HALF_ORACLE_DEADLINE_S = 15.0
"""Deadline of executions meant to time out: long enough for the agent to start and reach its
stopping point on a loaded 2-core machine (a test waits for it in full)."""


def with_deadline(task: Task, deadline_s: float) -> Task:
    """A copy of `task` with another wall-clock deadline."""
    agent = msgspec.structs.replace(task.spec.agent, deadline_s=deadline_s)
    return msgspec.structs.replace(task, spec=msgspec.structs.replace(task.spec, agent=agent))


def oracle_policy(task: Task, stop_after: int | None = None):
    solution = load_solution(task)

    def policy(call):
        reply = oracle_reply(solution, call.role, call.messages, stop_after=stop_after)
        return HANG if reply is None else reply

    return policy


def script_policy(script: list[dict], seen: list[dict]):
    """A policy that answers turn k with `script[k]` (k = assistant messages so far) and keeps the
    latest call's messages in `seen`."""

    def policy(call):
        seen[:] = call.messages
        return script[sum(m["role"] == "assistant" for m in call.messages)]

    return policy


async def run_policy(
    harness: Harness,
    server: ScriptedOpenAI,
    bridge: ControlBridge,
    task: Task,
    execution_id: str,
    policy,
    *,
    control: ExecutionControl | None = None,
    agent_command: list[str] | None = None,
) -> Outcome:
    """Run the reference agent on `task` with `policy` answering its model calls."""
    key = mint_api_key(execution_id)
    server.register(key, policy)
    control = control or ExecutionControl(
        max_turns=task.spec.agent.max_turns, token_budget=task.spec.agent.token_budget
    )
    bridge.register(key, control)
    return await harness.run(
        task, execution_id, control=control, api_key=key, agent_command=agent_command
    )
