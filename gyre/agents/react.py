"""`python -m gyre.agents.react`: the reference agent, a tool-calling loop on the official `openai` SDK.

Owns `AgentSettings`, `Agent` and `main`. The agent reads its instruction from
`$GYRE_INSTRUCTION_FILE` (or `--instruction`), works in the current folder with the tools of
`gyre.agents.tools`, and talks to `$OPENAI_BASE_URL` with `$OPENAI_API_KEY` as any OpenAI client
would. `delegate` runs a sub-agent with its own message history through the same endpoint
(header `X-Gyre-Role: sub_agent`); past `compact_chars` of history the agent asks for a summary
(`X-Gyre-Role: main_summary` / `sub_agent_summary`) and restarts from it. Tool errors (path
escapes included) go back to the model as tool results; nothing else is affected. Knows nothing
about gyre's proxy, records or scores: it is an ordinary OpenAI client.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import openai

from gyre.agents.tools import (
    SUB_AGENT_PROMPT,
    SUB_AGENT_TOOL_SCHEMAS,
    SYSTEM_PROMPT,
    TOOL_SCHEMAS,
    ToolError,
    Workspace,
)

__all__ = ["AgentSettings", "Agent", "COMPACT_PROMPT", "main"]

logger = logging.getLogger(__name__)

COMPACT_PROMPT = "Summarise what you have done so far and what is left, in a few lines."


@dataclass(frozen=True, kw_only=True)
class AgentSettings:
    """Knobs of the reference agent."""

    model: str = "gyre"
    max_turns: int = 50
    """Most model calls of one conversation (main or one sub-agent), summaries excluded."""
    max_tokens: int | None = None
    """`max_tokens` of each request; None lets the server decide."""
    temperature: float | None = None
    compact_chars: int = 0
    """Compact the history when its JSON exceeds this many characters; 0 disables compaction."""
    command_timeout_s: float = 30.0
    """Limit of one `run` tool call, seconds."""

    def __post_init__(self) -> None:
        if self.max_turns <= 0:
            raise ValueError(f"max_turns={self.max_turns} must be > 0")
        if self.compact_chars < 0:
            raise ValueError(f"compact_chars={self.compact_chars} must be >= 0")


class Agent:
    """One execution's agent: a main conversation that may delegate to sub-agents."""

    def __init__(self, client: openai.OpenAI, workspace: Workspace, settings: AgentSettings) -> None:
        self.client = client
        self.workspace = workspace
        self.settings = settings
        self.model_calls = 0

    def _create(self, messages: list[dict], role: str, tools: list[dict] | None):
        kwargs: dict = {}
        if self.settings.max_tokens is not None:
            kwargs["max_tokens"] = self.settings.max_tokens
        if self.settings.temperature is not None:
            kwargs["temperature"] = self.settings.temperature
        if tools is not None:
            kwargs["tools"] = tools
        self.model_calls += 1
        return self.client.chat.completions.create(
            model=self.settings.model, messages=messages, extra_headers={"X-Gyre-Role": role}, **kwargs
        )

    def _compact(self, messages: list[dict], task: str, system: str, summary_role: str) -> list[dict]:
        resp = self._create([*messages, {"role": "user", "content": COMPACT_PROMPT}], summary_role, None)
        summary = resp.choices[0].message.content or ""
        logger.info("compacted %d messages (%s)", len(messages), summary_role)
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": f"{task}\n\nProgress so far:\n{summary}"},
        ]

    def _tool(self, name: str, arguments: str) -> tuple[str, bool, str | None]:
        """Run one tool call: (result text, finished?, delegated task or None)."""
        try:
            args = json.loads(arguments or "{}")
            if not isinstance(args, dict):
                raise ValueError("arguments must be a JSON object")
        except ValueError as exc:
            return f"error: invalid arguments for {name}: {exc}", False, None
        try:
            if name == "finish":
                return str(args.get("summary", "")), True, None
            if name == "delegate":
                return "", False, str(args.get("task", ""))
            if name == "read_file":
                return self.workspace.read_file(args.get("path", "")), False, None
            if name == "write_file":
                return self.workspace.write_file(args.get("path", ""), args.get("content", "")), False, None
            if name == "list_dir":
                return self.workspace.list_dir(args.get("path", ".")), False, None
            if name == "run":
                return self.workspace.run(args.get("command", "")), False, None
            return f"error: unknown tool {name!r}", False, None
        except ToolError as exc:
            return f"error: {exc}", False, None
        except OSError as exc:
            return f"error: {exc.strerror or exc}", False, None

    def converse(self, task: str, *, sub_agent: bool = False) -> str:
        """Run one conversation (main, or a sub-agent's) to `finish` or `max_turns`; its summary."""
        system = SUB_AGENT_PROMPT if sub_agent else SYSTEM_PROMPT
        tools = SUB_AGENT_TOOL_SCHEMAS if sub_agent else TOOL_SCHEMAS
        role = "sub_agent" if sub_agent else "main"
        summary_role = "sub_agent_summary" if sub_agent else "main_summary"
        messages: list[dict] = [{"role": "system", "content": system}, {"role": "user", "content": task}]
        for _ in range(self.settings.max_turns):
            if self.settings.compact_chars and len(json.dumps(messages)) > self.settings.compact_chars:
                messages = self._compact(messages, task, system, summary_role)
            choice = self._create(messages, role, tools).choices[0]
            msg = choice.message
            assistant: dict = {"role": "assistant", "content": msg.content}
            calls = msg.tool_calls or []
            if calls:
                assistant["tool_calls"] = [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.function.name, "arguments": c.function.arguments}}
                    for c in calls
                ]
            messages.append(assistant)
            if not calls:
                if choice.finish_reason == "length":
                    messages.append({"role": "user", "content": "Your reply was cut off. Use a tool."})
                    continue
                return msg.content or ""
            finished, summary = False, ""
            for c in calls:
                result, done, delegated = self._tool(c.function.name, c.function.arguments)
                if delegated is not None:
                    result = "error: sub-agents cannot delegate" if sub_agent else self.converse(delegated, sub_agent=True)
                if done:
                    finished, summary = True, result
                messages.append({"role": "tool", "tool_call_id": c.id, "content": result})
            if finished:
                return summary
        return f"stopped after {self.settings.max_turns} turns"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gyre.agents.react", description=__doc__.splitlines()[0])
    parser.add_argument("--instruction", help="the task (default: read $GYRE_INSTRUCTION_FILE)")
    parser.add_argument("--workspace", default=".", help="folder the tools are confined to")
    parser.add_argument("--model", default=os.environ.get("GYRE_MODEL", "gyre"))
    parser.add_argument("--max-turns", type=int, default=50)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--compact-chars", type=int, default=0)
    parser.add_argument("--command-timeout-s", type=float, default=30.0)
    parser.add_argument("--request-timeout-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    instruction = args.instruction
    if instruction is None:
        path = os.environ.get("GYRE_INSTRUCTION_FILE")
        if not path:
            parser.error("give --instruction or set GYRE_INSTRUCTION_FILE")
        instruction = Path(path).read_text(encoding="utf-8")
    settings = AgentSettings(
        model=args.model, max_turns=args.max_turns, max_tokens=args.max_tokens,
        temperature=args.temperature, compact_chars=args.compact_chars,
        command_timeout_s=args.command_timeout_s,
    )
    client = openai.OpenAI(timeout=args.request_timeout_s, max_retries=2)
    agent = Agent(client, Workspace(args.workspace, command_timeout_s=args.command_timeout_s), settings)
    try:
        summary = agent.converse(instruction)
    except openai.APIError as exc:
        logger.error("model call failed after %d calls: %s", agent.model_calls, exc)
        return 3
    logger.info("done after %d model calls: %s", agent.model_calls, summary[:200])
    return 0


if __name__ == "__main__":
    sys.exit(main())
