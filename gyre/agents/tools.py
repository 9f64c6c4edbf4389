"""The reference agent's tools, confined to one workspace folder.

Owns `ToolError`, `Workspace` (path resolution: `../`, absolute paths and symlinks that lead out of
the workspace are refused), the tool implementations (`read_file`, `write_file`, `list_dir`,
`run`), their OpenAI function schemas (`TOOL_SCHEMAS`, `SUB_AGENT_TOOL_SCHEMAS`), the prompts
and the assistant messages (`tool_call_message`, `assistant_message`: a reply as a history holds
it) that the agents and the demonstration generator use, so demonstrations match what the agent
sends token for token. `finish` and `delegate` are handled by the agent loop (`gyre.agents.react`).
Knows nothing about HTTP or models. Path confinement protects against mistakes, not against a
hostile `run` command: isolation from other executions is the harness's job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import typing
from pathlib import Path
from typing import Any

from gyre.errors import ToolError

if typing.TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessage

__all__ = [
    "ToolError",
    "Workspace",
    "SYSTEM_PROMPT",
    "SUB_AGENT_PROMPT",
    "TOOL_SCHEMAS",
    "SUB_AGENT_TOOL_SCHEMAS",
    "format_run_result",
    "tool_call_message",
    "assistant_message",
]

SYSTEM_PROMPT = (
    "You are an agent working in a workspace folder. Use the tools to complete the task, "
    "then call finish."
)
SUB_AGENT_PROMPT = (
    "You are a sub-agent working in a shared workspace folder. Do the task you are given with "
    "the tools, then call finish with a short summary."
)


def _fn(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


_S = {"type": "string"}
_READ = _fn("read_file", "Read a text file.", {"path": _S}, ["path"])
_WRITE = _fn("write_file", "Write a text file.", {"path": _S, "content": _S}, ["path", "content"])
_LIST = _fn("list_dir", "List a folder.", {"path": _S}, [])
_RUN = _fn("run", "Run a shell command in the workspace.", {"command": _S}, ["command"])
_FINISH = _fn("finish", "End the task.", {"summary": _S}, [])
_DELEGATE = _fn("delegate", "Give a part of the task to a sub-agent.", {"task": _S}, ["task"])

TOOL_SCHEMAS: list[dict] = [_READ, _WRITE, _LIST, _RUN, _FINISH, _DELEGATE]
"""Tools of the main agent (OpenAI `tools=` format)."""
SUB_AGENT_TOOL_SCHEMAS: list[dict] = [_READ, _WRITE, _LIST, _RUN, _FINISH]
"""Tools of a sub-agent: no further delegation."""


def tool_call_message(name: str, arguments: dict, call_id: str) -> dict[str, Any]:
    """An assistant message making one call of the tool `name` with `arguments`."""
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


def assistant_message(reply: ChatCompletionMessage) -> dict[str, Any]:
    """The assistant message a history holds for `reply` (a chat completion's message): its
    content and, if it made any, its function tool calls. Raises `ValueError` for a tool call
    that is not a function call (the agents declare functions only)."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        calls = []
        for c in reply.tool_calls:
            if c.type != "function":
                raise ValueError(f"tool call {c.id!r} is a {c.type!r} call, not a function call")
            function = {"name": c.function.name, "arguments": c.function.arguments}
            calls.append({"id": c.id, "type": "function", "function": function})
        message["tool_calls"] = calls
    return message


def format_run_result(exit_code: int, output: str) -> str:
    """The tool result of `run` as the model sees it."""
    return f"exit code {exit_code}\n{output}"


class Workspace:
    """File and shell tools confined to `root`.

    `max_read_chars` truncates file reads and command output; `command_timeout_s` bounds `run`.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        command_timeout_s: float = 30.0,
        max_read_chars: int = 8000,
    ) -> None:
        self.root = Path(root).resolve(strict=True)
        self.command_timeout_s = command_timeout_s
        self.max_read_chars = max_read_chars

    def resolve(self, path: str) -> Path:
        """The real path of `path` (relative to the root) if it stays inside the workspace.

        Raises `ToolError` for empty paths, NUL bytes, and paths that lead outside (`..`, absolute
        paths elsewhere, symlinks pointing out)."""
        if not isinstance(path, str) or not path or "\0" in path:
            raise ToolError(f"invalid path {path!r}")
        real = (self.root / path).resolve()
        if not real.is_relative_to(self.root):
            raise ToolError(f"path {path!r} is outside the workspace")
        return real

    def read_file(self, path: str) -> str:
        """The text of a file (UTF-8, bad bytes replaced), cut at `max_read_chars` characters.

        Raises `ToolError` for paths outside the workspace, missing files and folders."""
        p = self.resolve(path)
        try:
            text = p.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            raise ToolError(f"no such file: {path}") from None
        except IsADirectoryError:
            raise ToolError(f"{path} is a folder") from None
        if len(text) > self.max_read_chars:
            return (
                text[: self.max_read_chars]
                + f"\n[... {len(text) - self.max_read_chars} more characters]"
            )
        return text

    def write_file(self, path: str, content: str) -> str:
        """Write `content` to a file (parent folders are created); returns a one-line receipt.

        Raises `ToolError` for paths outside the workspace, folders and non-string content."""
        if not isinstance(content, str):
            raise ToolError("content must be a string")
        p = self.resolve(path)
        if p == self.root or p.is_dir():
            raise ToolError(f"{path} is a folder")
        p.parent.mkdir(parents=True, exist_ok=True)
        # resolve() again: a parent created above could not be a symlink, but one may have appeared
        if not p.parent.resolve().is_relative_to(self.root):
            raise ToolError(f"path {path!r} is outside the workspace")
        with open(p, "w", encoding="utf-8") as f:
            f.write(content)
        return f"wrote {len(content)} characters to {path}"

    def list_dir(self, path: str = ".") -> str:
        """Names in a folder, sorted, one per line, folders with a trailing '/'; '(empty)' if none.

        Raises `ToolError` for paths outside the workspace and for non-folders."""
        p = self.resolve(path or ".")
        if not p.is_dir():
            raise ToolError(f"no such folder: {path}")
        names = sorted(e.name + ("/" if e.is_dir() else "") for e in p.iterdir())
        return "\n".join(names) if names else "(empty)"

    def run(self, command: str) -> str:
        """Run `command` with /bin/sh in the workspace; returns `exit code N` and the combined
        output (its last `max_read_chars` characters). Raises `ToolError` at `command_timeout_s`
        (the command's process group is killed) and for an empty command. Not confined: a shell
        command can reach any path the agent's user can."""
        if not isinstance(command, str) or not command.strip():
            raise ToolError("command must be a non-empty string")
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            process_group=0,  # no own autogroup
        )
        try:
            out, _ = proc.communicate(timeout=self.command_timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            text = out.decode("utf-8", errors="replace")[-self.max_read_chars :]
            raise ToolError(
                f"command timed out after {self.command_timeout_s} s; output so far:\n{text}"
            ) from None
        text = out.decode("utf-8", errors="replace")
        if len(text) > self.max_read_chars:
            text = text[-self.max_read_chars :]
        return format_run_result(proc.returncode, text)
