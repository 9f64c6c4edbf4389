"""The scripted oracle: what a perfect model would answer, read from a task's reference solution.

Owns `oracle_reply` (the assistant message for a conversation state, so a scripted OpenAI server
can drive the reference agent to a full or a deliberately partial solution) and `demonstration`
(one complete OpenAI chat conversation with tool calls and real tool results, obtained by running
the solution's tool calls on a copy of the task's environment: warm-start SFT data that matches
what `gyre.agents.react` sends). Knows nothing about HTTP or training.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from gyre.agents.tools import (
    SUB_AGENT_PROMPT,
    SUB_AGENT_TOOL_SCHEMAS,
    SYSTEM_PROMPT,
    TOOL_SCHEMAS,
    ToolError,
    Workspace,
    tool_call_message,
)
from gyre.tasks.solution import Solution, Step, load_solution
from gyre.tasks.task import Task

__all__ = ["oracle_reply", "demonstration", "demonstration_for", "FINISH_SUMMARY"]

FINISH_SUMMARY = "done"


def oracle_reply(
    solution: Solution, role: str | None, messages: list[dict], *, stop_after: int | None = None
) -> dict | None:
    """The oracle's next assistant message, or None where a half-oracle stops answering.

    The conversation is the main one unless `role` is `sub_agent` (then the sub-agent's steps are
    found by its task, the first user message). The turn is the number of assistant messages so
    far: step `turn`, then `finish`. `stop_after=k` returns None for main turns >= k.
    """
    if role == "sub_agent":
        steps = solution.sub_agents[messages[1]["content"]]
        prefix = "sub"
    else:
        steps = solution.main
        prefix = "main"
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    if role != "sub_agent" and stop_after is not None and turn >= stop_after:
        return None
    if turn < len(steps):
        return tool_call_message(steps[turn].tool, steps[turn].arguments, f"call_{prefix}_{turn}")
    if turn == len(steps):
        return tool_call_message("finish", {"summary": FINISH_SUMMARY}, f"call_{prefix}_{turn}")
    return {"role": "assistant", "content": FINISH_SUMMARY}


def _run_steps(
    ws: Workspace,
    solution: Solution,
    steps: list[Step],
    task_text: str,
    sub_agent: bool,
    subs: list[dict],
) -> list[dict]:
    """Play `steps` on `ws`; return the conversation as the react agent builds it.

    Sub-agent conversations are appended to `subs` in the order they ran."""
    system = SUB_AGENT_PROMPT if sub_agent else SYSTEM_PROMPT
    messages: list[dict] = [
        {"role": "system", "content": system},
        {"role": "user", "content": task_text},
    ]
    prefix = "sub" if sub_agent else "main"
    for turn, step in enumerate(steps):
        msg = tool_call_message(step.tool, step.arguments, f"call_{prefix}_{turn}")
        messages.append(msg)
        if step.tool == "delegate":
            sub = _run_steps(
                ws,
                solution,
                solution.sub_agents[step.arguments["task"]],
                step.arguments["task"],
                True,
                subs,
            )
            subs.append({"messages": sub, "tools": SUB_AGENT_TOOL_SCHEMAS})
            result = FINISH_SUMMARY
        else:
            try:
                result = getattr(ws, step.tool)(**step.arguments)
            except ToolError as exc:
                result = f"error: {exc}"
        messages.append(
            {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": result}
        )
    messages.append(
        tool_call_message("finish", {"summary": FINISH_SUMMARY}, f"call_{prefix}_{len(steps)}")
    )
    return messages


def demonstration_for(
    instruction: str, solution: Solution, environment: Path | None = None, task_id: str = ""
) -> dict:
    """One SFT example: `{"task_id", "messages": [...], "tools": [...], "sub_agents": [...]}`.

    `messages` is the main conversation exactly as `gyre.agents.react` would build it, ending with
    the assistant's `finish` call. Tool results are real: the steps run on a temporary copy of
    `environment` (an empty folder if None). Sub-agent conversations of `delegate` steps are under
    `"sub_agents"`, each with its own messages and tools."""
    with tempfile.TemporaryDirectory(prefix="gyre-demo-") as tmp:
        work = Path(tmp) / "w"
        if environment is not None:
            shutil.copytree(environment, work, symlinks=True)
        else:
            work.mkdir()
        ws = Workspace(work)
        subs: list[dict] = []
        messages = _run_steps(ws, solution, solution.main, instruction, False, subs)
    return {"task_id": task_id, "messages": messages, "tools": TOOL_SCHEMAS, "sub_agents": subs}


def demonstration(task: Task) -> dict:
    """`demonstration_for` a task folder with its reference solution.

    Raises `TaskError` if the task has no valid `solution/oracle.json`."""
    return demonstration_for(
        task.instruction, load_solution(task), task.environment_dir, task.task_id
    )
