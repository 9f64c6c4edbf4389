"""`python -m gyre.agents.react`: the reference agent, a tool-calling loop on the `openai` SDK.

Owns `AgentSettings`, `Agent`, `history_chars`, `progress_prompt` and `main`. The agent reads its
instruction from `$GYRE_INSTRUCTION_FILE` (or `--instruction`), works in the current folder with the
tools of `gyre.agents.tools`, and talks to `$OPENAI_BASE_URL` with `$OPENAI_API_KEY` as any OpenAI
client would. `delegate` runs a sub-agent with its own message history through the same endpoint
(header `X-Gyre-Role: sub_agent`). Once a history is longer than `compact_chars` (`history_chars`:
the text the model reads) the agent asks for a summary (`X-Gyre-Role: main_summary` /
`sub_agent_summary`) and restarts from it (`progress_prompt`). Tool errors (path escapes included)
go back to the model as tool results. So do malformed tool calls (B30): bad JSON arguments, an
unknown tool, a missing or non-string argument, or a reply the server could not parse as a tool call
(its optional `gyre_tool_call_error` field); after `max_malformed_replies` such replies in a row the
conversation ends with that reason. Knows nothing about gyre's proxy, records or scores: it is an
ordinary OpenAI client.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import openai

from gyre.agents.tools import (
    SUB_AGENT_PROMPT,
    SUB_AGENT_TOOL_SCHEMAS,
    SYSTEM_PROMPT,
    TOOL_SCHEMAS,
    ToolError,
    Workspace,
    assistant_message,
)

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

__all__ = [
    "AgentSettings",
    "Agent",
    "COMPACT_PROMPT",
    "EXIT_MALFORMED",
    "history_chars",
    "main",
    "progress_prompt",
]

logger = logging.getLogger(__name__)

COMPACT_PROMPT = "Summarise what you have done so far and what is left, in a few lines."
EXIT_MALFORMED = 4
"""Exit status of `main` when the main conversation ended on `max_malformed_replies`."""


def history_chars(messages: list[dict]) -> int:
    """Length of a message history as the model reads it, characters: every message's text
    `content`, plus each tool call's function name and JSON arguments. Roles, tool-call IDs and
    JSON punctuation are not counted, so where a history is compacted does not depend on the
    IDs a server gives tool calls (gyre's proxy names them after the execution, and execution
    IDs differ in length from run to run). The warm start's demonstrations and the offline
    evaluation compact with the same measure (`gyre.model.demonstrations`,
    `gyre.model.offline_eval`)."""
    total = 0
    for message in messages:
        content = message.get("content")
        total += len(content) if isinstance(content, str) else 0
        for call in message.get("tool_calls") or ():
            function = call["function"]
            total += len(function["name"]) + len(function["arguments"] or "")
    return total


def progress_prompt(task: str, summary: str) -> str:
    """The user message a conversation restarts from after a compaction: its task and the
    model's summary under "Progress so far:"."""
    return f"{task}\n\nProgress so far:\n{summary}"


_ARGUMENTS = {
    s["function"]["name"]: (
        s["function"]["parameters"]["required"],
        s["function"]["parameters"]["properties"],
    )
    for s in TOOL_SCHEMAS
}
"""Tool name -> (required argument names, argument schemas); every argument is a string."""


class _MalformedCall(ValueError):
    """A tool call that cannot be run as written: fed back to the model, counted (B30)."""


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
    """Compact the history when it is longer than this many characters (`history_chars`: the
    text the model reads); 0 disables compaction."""
    command_timeout_s: float = 30.0
    """Limit of one `run` tool call, seconds."""
    max_malformed_replies: int = 3
    """Replies in a row with a malformed tool call that are fed back as tool errors (retries);
    the next one ends the conversation with the reason (B30). A well-formed reply resets it."""

    def __post_init__(self) -> None:
        if self.max_turns <= 0:
            raise ValueError(f"max_turns={self.max_turns} must be > 0")
        if self.max_malformed_replies < 0:
            raise ValueError(f"max_malformed_replies={self.max_malformed_replies} must be >= 0")
        if self.compact_chars < 0:
            raise ValueError(f"compact_chars={self.compact_chars} must be >= 0")


class Agent:
    """One execution's agent: a main conversation that may delegate to sub-agents."""

    def __init__(
        self, client: openai.OpenAI, workspace: Workspace, settings: AgentSettings
    ) -> None:
        self.client = client
        self.workspace = workspace
        self.settings = settings
        self.model_calls = 0
        self.malformed_replies = 0
        """Replies with a malformed tool call, all conversations (each fed back or ending one)."""
        self.stop_reason: str | None = None
        """Why the main conversation ended early (malformed replies), None otherwise."""

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
            model=self.settings.model,
            messages=cast("list[ChatCompletionMessageParam]", messages),
            extra_headers={"X-Gyre-Role": role},
            **kwargs,
        )

    def _compact(
        self, messages: list[dict], task: str, system: str, summary_role: str
    ) -> list[dict]:
        resp = self._create(
            [*messages, {"role": "user", "content": COMPACT_PROMPT}], summary_role, None
        )
        summary = resp.choices[0].message.content or ""
        logger.info("compacted %d messages (%s)", len(messages), summary_role)
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": progress_prompt(task, summary)},
        ]

    @staticmethod
    def _arguments(name: str, arguments: str | None) -> dict:
        """The arguments of a call to tool `name`, checked against its schema; `_MalformedCall`
        for arguments that are not a JSON object, an unknown tool, a missing or non-string one."""
        if name not in _ARGUMENTS:
            raise _MalformedCall(f"unknown tool {name!r}; the tools are {', '.join(_ARGUMENTS)}")
        try:
            args = json.loads(arguments or "{}")
        except ValueError as exc:
            raise _MalformedCall(f"invalid arguments for {name}: {exc}") from None
        if not isinstance(args, dict):
            raise _MalformedCall(f"invalid arguments for {name}: arguments must be a JSON object")
        required, properties = _ARGUMENTS[name]
        missing = [k for k in required if k not in args]
        if missing:
            raise _MalformedCall(f"{name} is missing its argument {', '.join(map(repr, missing))}")
        wrong = [k for k in properties if k in args and not isinstance(args[k], str)]
        if wrong:
            raise _MalformedCall(f"{name}: argument {', '.join(map(repr, wrong))} must be a string")
        return args

    def _tool(self, name: str, arguments: str | None) -> tuple[str, bool, str | None]:
        """Run one tool call: (result text, finished?, delegated task or None). Raises
        `_MalformedCall` for a call that cannot be run as written."""
        args = self._arguments(name, arguments)
        try:
            if name == "finish":
                return str(args.get("summary", "")), True, None
            if name == "delegate":
                return "", False, args["task"]
            if name == "read_file":
                return self.workspace.read_file(args["path"]), False, None
            if name == "write_file":
                return self.workspace.write_file(args["path"], args["content"]), False, None
            if name == "list_dir":
                return self.workspace.list_dir(args.get("path", ".")), False, None
            return self.workspace.run(args["command"]), False, None
        except ToolError as exc:
            return f"error: {exc}", False, None
        except OSError as exc:
            return f"error: {exc.strerror or exc}", False, None

    def _run_calls(
        self, calls: list, messages: list[dict], errors: list[str], *, sub_agent: bool
    ) -> tuple[bool, str]:
        """Run a reply's tool calls, appending each result to `messages` and each malformed
        call's error to `errors`; (finished?, the `finish` summary)."""
        finished, summary = False, ""
        for c in calls:
            try:
                result, done, delegated = self._tool(c.function.name, c.function.arguments)
            except _MalformedCall as exc:
                errors.append(str(exc))
                result, done, delegated = f"error: {exc}", False, None
            if delegated is not None:
                result = (
                    "error: sub-agents cannot delegate"
                    if sub_agent
                    else self.converse(delegated, sub_agent=True)
                )
            if done:
                finished, summary = True, result
            messages.append({"role": "tool", "tool_call_id": c.id, "content": result})
        return finished, summary

    def converse(self, task: str, *, sub_agent: bool = False) -> str:
        """Run one conversation (main, or a sub-agent's) to `finish` or `max_turns`; its summary."""
        system = SUB_AGENT_PROMPT if sub_agent else SYSTEM_PROMPT
        tools = SUB_AGENT_TOOL_SCHEMAS if sub_agent else TOOL_SCHEMAS
        role = "sub_agent" if sub_agent else "main"
        summary_role = "sub_agent_summary" if sub_agent else "main_summary"
        messages: list[dict] = [
            {"role": "system", "content": system},
            {"role": "user", "content": task},
        ]
        malformed_in_a_row = 0
        for _ in range(self.settings.max_turns):
            if (
                self.settings.compact_chars
                and history_chars(messages) > self.settings.compact_chars
            ):
                messages = self._compact(messages, task, system, summary_role)
            choice = self._create(messages, role, tools).choices[0]
            msg = choice.message
            calls = msg.tool_calls or []
            messages.append(assistant_message(msg))
            errors: list[str] = []
            unparsed = (msg.model_extra or {}).get("gyre_tool_call_error")
            if not calls and isinstance(unparsed, str) and choice.finish_reason != "length":
                errors.append(unparsed)
                messages.append(
                    {
                        "role": "user",
                        "content": (
                            f"error: your tool call could not be parsed ({unparsed}). "
                            "Call the tool again with a JSON object of arguments."
                        ),
                    }
                )
            elif not calls:
                if choice.finish_reason == "length":
                    messages.append(
                        {"role": "user", "content": "Your reply was cut off. Use a tool."}
                    )
                    continue
                return msg.content or ""
            finished, summary = self._run_calls(calls, messages, errors, sub_agent=sub_agent)
            if finished:
                return summary
            if not errors:
                malformed_in_a_row = 0
                continue
            self.malformed_replies += 1
            malformed_in_a_row += 1
            if malformed_in_a_row > self.settings.max_malformed_replies:
                reason = (
                    f"stopped after {malformed_in_a_row} replies in a row with a malformed "
                    f"tool call; the last: {errors[-1]}"
                )
                logger.warning("%s (%s)", reason, role)
                if not sub_agent:
                    self.stop_reason = reason
                return reason
        return f"stopped after {self.settings.max_turns} turns"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gyre.agents.react", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--instruction", help="the task (default: read $GYRE_INSTRUCTION_FILE)")
    parser.add_argument("--workspace", default=".", help="folder the tools are confined to")
    parser.add_argument("--model", default=os.environ.get("GYRE_MODEL", "gyre"))
    parser.add_argument("--max-turns", type=int, default=50)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--compact-chars", type=int, default=0)
    parser.add_argument("--command-timeout-s", type=float, default=30.0)
    parser.add_argument("--max-malformed-replies", type=int, default=3)
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
        model=args.model,
        max_turns=args.max_turns,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        compact_chars=args.compact_chars,
        command_timeout_s=args.command_timeout_s,
        max_malformed_replies=args.max_malformed_replies,
    )
    client = openai.OpenAI(timeout=args.request_timeout_s, max_retries=2)
    agent = Agent(
        client, Workspace(args.workspace, command_timeout_s=args.command_timeout_s), settings
    )
    try:
        summary = agent.converse(instruction)
    except openai.APIError as exc:
        logger.error("model call failed after %d calls: %s", agent.model_calls, exc)
        return 3
    if agent.stop_reason is not None:
        logger.error("%s (%d model calls)", agent.stop_reason, agent.model_calls)
        return EXIT_MALFORMED
    logger.info("done after %d model calls: %s", agent.model_calls, summary[:200])
    return 0


if __name__ == "__main__":
    sys.exit(main())
