"""Demonstrations are exactly the conversations the reference agent has with the oracle."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import openai
import pytest

from gyre.agents.oracle import demonstration, demonstration_for, oracle_reply
from gyre.agents.react import Agent, AgentSettings
from gyre.agents.tools import Workspace
from gyre.tasks.solution import load_solution
from gyre.tasks.suites import learnable_examples
from gyre.tasks.task import load_suite

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


@pytest.mark.parametrize(
    "suite, index", [("learnable", 0), ("terminal-mini", 2), ("multiagent-mini", 0)]
)
def test_demonstration_equals_the_agents_conversation(
    server, tmp_path: Path, suite: str, index: int
) -> None:
    task = load_suite(EXAMPLES / suite)[index]
    solution = load_solution(task)
    server.register("k", lambda call: oracle_reply(solution, call.role, call.messages))
    shutil.copytree(task.environment_dir, tmp_path / "ws")
    agent = Agent(
        openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0),
        Workspace(tmp_path / "ws"),
        AgentSettings(),
    )
    agent.converse(task.instruction)
    demo = demonstration(task)
    main_calls = [c for c in server.calls if c.role == "main"]
    last = main_calls[-1]
    # the demonstration is the last request's messages plus the reply that finished the task
    assert json.loads(json.dumps(last.messages + [last.reply])) == demo["messages"]
    assert demo["tools"] == last.tools
    sub_calls = [c for c in server.calls if c.role == "sub_agent"]
    finals = [c for c in sub_calls if c.reply["tool_calls"][0]["function"]["name"] == "finish"]
    assert [json.loads(json.dumps(c.messages + [c.reply])) for c in finals] == [
        s["messages"] for s in demo["sub_agents"]
    ]


def test_learnable_demonstration_shape() -> None:
    ((instruction, solution),) = learnable_examples(1, seed=5)
    demo = demonstration_for(instruction, solution)
    roles = [m["role"] for m in demo["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    call = demo["messages"][2]["tool_calls"][0]["function"]
    args = json.loads(call["arguments"])
    assert call["name"] == "write_file"
    assert instruction == f"Write the word {args['content']} to the file {args['path']}.\n"
    assert (
        demo["messages"][3]["content"]
        == f"wrote {len(args['content'])} characters to {args['path']}"
    )
    assert demo["messages"][4]["tool_calls"][0]["function"]["name"] == "finish"
