"""`python -m gyre.agents.long_horizon`: a scripted long-horizon agent on the official `openai` SDK.

Owns `LongHorizonSettings`, `ToolScript`, `Progress`, `LongHorizonAgent`, `long_horizon_command`
and `main`. It stands in for an hours-long coding execution (issue 16): a main conversation that
does tool work in its workspace (writes, reads, appends, greps and lists files; the outputs are
the files' real contents, hundreds of tokens each), compacts its history when its context passes
a threshold (a summary call with `X-Gyre-Role: main_summary`, then a fresh history holding the
summary) and delegates to sub-agents (`sub_agent`, their own histories, compacted as
`sub_agent_summary`). The tool work follows a script seeded by the execution, not the model's
replies, so an untrained model still produces an execution of a chosen length: it stops once it
made `min_calls` calls and counted `target_tokens` execution tokens (from each reply's `usage`).
Like `gyre.agents.react` it is an ordinary OpenAI client: it knows nothing about gyre's proxy,
records or scores; it writes `result.json` in the `longtail` suite's format after every call.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

import openai

from gyre.agents.longtail import instruction_and_seed
from gyre.agents.tools import assistant_message

__all__ = [
    "LONG_HORIZON_AGENT",
    "RESULT_FILE",
    "WORK_DIR",
    "LongHorizonSettings",
    "ToolScript",
    "Progress",
    "LongHorizonAgent",
    "long_horizon_command",
    "main",
]

logger = logging.getLogger(__name__)

LONG_HORIZON_AGENT: tuple[str, ...] = (sys.executable, "-P", "-m", "gyre.agents.long_horizon")
"""The agent's command line without options (`-P`: the workspace cannot shadow its imports)."""

RESULT_FILE = "result.json"
"""Rewritten in the workspace after every call: `{"turns_planned": min_calls, "turns_done": calls,
"finished", "tokens", "compactions", "sub_agents"}` (the `longtail` verifier scores
turns done / turns planned)."""

WORK_DIR = "work"
"""The workspace folder the tool script writes its files into."""

SYSTEM_PROMPT = "You are building a repository step by step. After each reply a tool runs."
SUB_AGENT_PROMPT = "You are a sub-agent. Do the delegated part of the work and report back."
SUMMARY_REQUEST = "Summarise the work so far in a few lines: files written, what is left."

_WORDS = (
    "def return import class self print if else for while in range len list dict str int path "
    "open read write json value key name result error test assert config parse build run main "
    "item items index count total node tree token call record log step batch loss"
).split()


@dataclass(frozen=True, kw_only=True)
class LongHorizonSettings:
    """The workload's knobs: its length, its compaction threshold, its sub-agents, its sampling."""

    min_calls: int = 300
    """Model calls (all roles) the execution makes at least."""
    target_tokens: int = 131072
    """Execution tokens (new prompt tokens + completion tokens, summed over calls, from `usage`)
    the execution gathers at least; it stops at the first call that has both."""
    max_calls: int = 10000
    """Hard cap on model calls."""
    compact_at_tokens: int = 16384
    """A history whose context (last prompt + completion tokens) reaches this is compacted."""
    tool_output_chars: int = 1200
    """About how many characters one tool output holds (a file's contents, grep lines)."""
    sub_agent_every: int = 25
    """Every this many main turns, one turn delegates to a sub-agent (0: never)."""
    sub_agent_calls: int = 5
    """Model calls of one sub-agent conversation (its compaction calls not counted)."""
    max_tokens: int = 32
    """`max_tokens` of each request."""
    temperature: float = 1.0
    model: str = "gyre"

    def __post_init__(self) -> None:
        for name in ("min_calls", "max_calls", "compact_at_tokens", "tool_output_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        for name in ("target_tokens", "sub_agent_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        if self.sub_agent_calls < 1:
            raise ValueError(f"sub_agent_calls={self.sub_agent_calls} must be >= 1")
        if self.max_calls < self.min_calls:
            raise ValueError(f"max_calls={self.max_calls} must be >= min_calls={self.min_calls}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens} must be >= 1")


class ToolScript:
    """The tool work, drawn from `random.Random(seed)`: each `run_next` does one operation on the
    files under `<workspace>/work/` and returns its output as the agent reports it.

    Operations: `write` (a new module of about `output_chars` characters; the output echoes it),
    `read` (a file's contents, at most `output_chars`), `append` (lines added to a file, echoed),
    `grep` (matching lines of every file, at most `output_chars`), `ls` (names and sizes). The
    first operation is always a `write`, so every later one has a file to work on.
    """

    KINDS = ("write", "read", "append", "grep", "ls")
    WEIGHTS = (3, 4, 2, 2, 1)

    def __init__(self, workspace: Path, seed: int, output_chars: int) -> None:
        self.root = workspace / WORK_DIR
        self.root.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(seed)
        self.output_chars = output_chars
        self.files: list[str] = []
        self.operations = 0

    def _lines(self, chars: int) -> str:
        rng, out, n = self.rng, [], 0
        while n < chars:
            words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 9)))
            line = f"{'    ' * rng.randint(0, 2)}{words} = {rng.randint(0, 9999)}\n"
            out.append(line)
            n += len(line)
        return "".join(out)

    def run_next(self) -> str:
        """Do the next operation; its output (str, about `output_chars` characters or less)."""
        kind = "write" if not self.files else self.rng.choices(self.KINDS, self.WEIGHTS)[0]
        self.operations += 1
        if kind == "write":
            name = f"mod_{len(self.files)}.py"
            text = self._lines(self.output_chars)
            (self.root / name).write_text(text)
            self.files.append(name)
            return f"$ write {WORK_DIR}/{name}\nwrote {len(text)} bytes:\n{text}"
        name = self.rng.choice(self.files)
        if kind == "read":
            text = (self.root / name).read_text()
            return f"$ cat {WORK_DIR}/{name}\n{text[-self.output_chars :]}"
        if kind == "append":
            text = self._lines(self.output_chars // 3)
            with (self.root / name).open("a") as f:
                f.write(text)
            return f"$ append {WORK_DIR}/{name}\n{text}"
        if kind == "grep":
            word = self.rng.choice(_WORDS)
            hits, n = [], 0
            for other in self.files:
                for i, line in enumerate((self.root / other).read_text().splitlines()):
                    if word in line.split() and n < self.output_chars:
                        hits.append(f"{WORK_DIR}/{other}:{i + 1}:{line}")
                        n += len(hits[-1]) + 1
            return f"$ grep -n {word} {WORK_DIR}/*.py\n" + "\n".join(hits)
        sizes = [f"{(self.root / f).stat().st_size:8d} {WORK_DIR}/{f}" for f in self.files]
        return "$ ls -l\n" + "\n".join(sizes[-60:])


@dataclass
class Progress:
    """What the agent has done so far (all roles)."""

    calls: int = 0
    tokens: int = 0
    """Execution tokens counted from `usage`: per call, its prompt tokens beyond the context it
    extends (all of them on a fresh or compacted history) plus its completion tokens."""
    compactions: int = 0
    sub_agents: int = 0
    calls_by_role: dict[str, int] = field(default_factory=dict)
    longest_context: int = 0
    """The longest prompt + completion of one call, in tokens."""


@dataclass
class _History:
    system: str
    task: str
    role: str
    summary_role: str
    messages: list[dict] = field(default_factory=list)
    context: int = 0
    """Prompt + completion tokens of this history's last call (0: nothing sent yet)."""

    def __post_init__(self) -> None:
        self.restart()

    def restart(self, summary: str | None = None) -> None:
        self.messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": self.task},
        ]
        if summary is not None:
            self.messages.append({"role": "user", "content": summary})
        self.context = 0


class LongHorizonAgent:
    """One execution: `run()` drives the main conversation until the settings' length is reached.

    `client` is an `openai.OpenAI` (or the slice of it the agent uses: `chat.completions.create`
    returning choices with `message` and `usage`). Raises `openai.APIError` when a call fails
    (the result file then holds the progress so far) and `ValueError` for a reply without
    `usage`.
    """

    def __init__(
        self,
        client,
        instruction: str,
        workspace: Path,
        settings: LongHorizonSettings,
        seed: int,
    ) -> None:
        self.client = client
        self.instruction = instruction
        self.workspace = workspace
        self.settings = settings
        self.script = ToolScript(workspace, seed, settings.tool_output_chars)
        self.progress = Progress()

    def done(self) -> bool:
        p, s = self.progress, self.settings
        return p.calls >= s.max_calls or (p.calls >= s.min_calls and p.tokens >= s.target_tokens)

    def run(self) -> Progress:
        """Make the execution's calls; returns the final `Progress`."""
        s = self.settings
        main = _History(SYSTEM_PROMPT, self.instruction, "main", "main_summary")
        self._write_result()
        turn = 0
        while not self.done():
            turn += 1
            self._turn(main, delegate=bool(s.sub_agent_every) and turn % s.sub_agent_every == 0)
        self._write_result()
        return self.progress

    def _turn(self, history: _History, *, delegate: bool = False) -> str:
        """One call on `history`, then its tool work (with `delegate`, a sub-agent conversation
        whose report is the tool output); first compacts the history when its context reached the
        threshold. Returns the reply text."""
        if history.context >= self.settings.compact_at_tokens:
            self._compact(history)
        message = self._call(history, history.role)
        result = self._delegate() if delegate else self.script.run_next()
        calls = message.get("tool_calls") or []
        if calls:  # a tool result answers each call the reply made
            history.messages += [
                {"role": "tool", "tool_call_id": c["id"], "content": result if i == 0 else "ok"}
                for i, c in enumerate(calls)
            ]
        else:
            history.messages.append({"role": "user", "content": f"Tool output:\n{result}"})
        self._write_result()
        return message.get("content") or ""

    def _call(self, history: _History, role: str) -> dict:
        """One chat completion on `history` as `role`; appends and returns the reply message."""
        response = self.client.chat.completions.create(
            model=self.settings.model,
            messages=history.messages,
            max_tokens=self.settings.max_tokens,
            temperature=self.settings.temperature,
            extra_headers={"X-Gyre-Role": role},
        )
        msg = response.choices[0].message
        assistant = assistant_message(msg)
        history.messages.append(assistant)
        usage = response.usage
        if usage is None:
            raise ValueError("the server's reply has no `usage`: the agent counts tokens from it")
        p = self.progress
        p.calls += 1
        p.calls_by_role[role] = p.calls_by_role.get(role, 0) + 1
        p.tokens += usage.prompt_tokens - history.context + usage.completion_tokens
        history.context = usage.prompt_tokens + usage.completion_tokens
        p.longest_context = max(p.longest_context, history.context)
        return assistant

    def _compact(self, history: _History) -> None:
        """A summary call on the whole history (its summary role), then a fresh history: system,
        task and the summary with the files written so far."""
        history.messages.append({"role": "user", "content": SUMMARY_REQUEST})
        summary = self._call(history, history.summary_role).get("content") or ""
        self.progress.compactions += 1
        files = ", ".join(self.script.files[-40:])
        history.restart(
            f"Summary of the work so far (compaction {self.progress.compactions}):\n"
            f"{summary}\nFiles in {WORK_DIR}/: {files}"
        )

    def _delegate(self) -> str:
        """Run a sub-agent conversation of `sub_agent_calls` calls; its report for the main
        history."""
        self.progress.sub_agents += 1
        task = f"Sub-task {self.progress.sub_agents}: extend the modules in {WORK_DIR}/."
        sub = _History(SUB_AGENT_PROMPT, task, "sub_agent", "sub_agent_summary")
        reply = ""
        for _ in range(self.settings.sub_agent_calls):
            reply = self._turn(sub)
        return f"sub-agent {self.progress.sub_agents} reports:\n{reply}"

    def _write_result(self) -> None:
        p = self.progress
        data = {
            "turns_planned": self.settings.min_calls,
            "turns_done": p.calls,
            "finished": self.done(),
            "tokens": p.tokens,
            "compactions": p.compactions,
            "sub_agents": p.sub_agents,
        }
        tmp = self.workspace / f".{RESULT_FILE}.tmp"
        tmp.write_text(json.dumps(data) + "\n")
        os.replace(tmp, self.workspace / RESULT_FILE)  # a reader never sees a half-written file


def long_horizon_command(settings: LongHorizonSettings) -> tuple[str, ...]:
    """The harness `agent_command` that runs this agent with `settings`."""
    args: list[str] = []
    for f in dataclasses.fields(settings):
        args += [f"--{f.name.replace('_', '-')}", str(getattr(settings, f.name))]
    return (*LONG_HORIZON_AGENT, *args)


def main(argv: list[str] | None = None) -> int:
    d = LongHorizonSettings()
    parser = argparse.ArgumentParser(
        prog="python -m gyre.agents.long_horizon", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--instruction", help="the task (default: read $GYRE_INSTRUCTION_FILE)")
    parser.add_argument("--workspace", default=".", help="folder the tool work runs in")
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the tool script (default: hash of $GYRE_EXECUTION_ID, else of "
        "$OPENAI_API_KEY)",
    )
    for f in dataclasses.fields(d):
        kind = type(getattr(d, f.name))
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=getattr(d, f.name))
    parser.add_argument("--request-timeout-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.model == d.model:
        args.model = os.environ.get("GYRE_MODEL", d.model)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        settings = LongHorizonSettings(
            **{f.name: getattr(args, f.name) for f in dataclasses.fields(d)}
        )
    except ValueError as exc:
        parser.error(str(exc))
    instruction, seed = instruction_and_seed(args, parser)
    client = openai.OpenAI(timeout=args.request_timeout_s, max_retries=2)
    agent = LongHorizonAgent(client, instruction, Path(args.workspace), settings, seed)
    try:
        progress = agent.run()
    except openai.APIError as exc:
        logger.error("model call failed after %d calls: %s", agent.progress.calls, exc)
        return 3
    logger.info(
        "done: %d calls, %d tokens, %d compactions, %d sub-agents, longest context %d",
        progress.calls,
        progress.tokens,
        progress.compactions,
        progress.sub_agents,
        progress.longest_context,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
