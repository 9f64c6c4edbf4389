"""`python -m gyre.agents.longtail`: a synthetic long-horizon agent on the official `openai` SDK.

Owns `LongtailSettings`, `Plan`, `draw_plan`, `plan_seed`, `instruction_and_seed` (the
scripted agents' command line), `run_plan`, `longtail_command` and
`main`. It stands in for hours-long agent executions in the schedule benchmark (issue 7): most of
its wall time is spent in "tool calls". It draws its number of turns K from a lognormal (median,
sigma, capped by `max_turns`) and a lognormal tool time per turn, seeded by a hash of its
execution (`$GYRE_EXECUTION_ID`, else `$OPENAI_API_KEY`, or `--seed`), so a run is reproducible.
Then it loops K times: one chat completion on the growing history, a tool call that sleeps, a
tool result appended; after every turn it rewrites `result.json` in its workspace (the
`longtail` suite's verifier scores turns done / K). Like `gyre.agents.react` it is an ordinary
OpenAI client: it knows nothing about gyre's proxy, records or scores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import openai

from gyre.agents.tools import assistant_message

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

__all__ = [
    "LONGTAIL_AGENT",
    "RESULT_FILE",
    "LongtailSettings",
    "Plan",
    "draw_plan",
    "plan_seed",
    "instruction_and_seed",
    "run_plan",
    "longtail_command",
    "main",
]

logger = logging.getLogger(__name__)

LONGTAIL_AGENT: tuple[str, ...] = (sys.executable, "-P", "-m", "gyre.agents.longtail")
"""The agent's command line without options (`-P`: the workspace cannot shadow its imports)."""

RESULT_FILE = "result.json"
"""Written into the workspace after every turn: `{"turns_planned", "turns_done", "finished"}`."""

SYSTEM_PROMPT = "You are working on a long task. After each reply a tool runs and reports back."


@dataclass(frozen=True, kw_only=True)
class LongtailSettings:
    """The workload's knobs: lognormal turns and tool times, and each request's sampling."""

    turns_median: float = 8.0
    """Median of the number of turns K (model calls) of an execution."""
    turns_sigma: float = 1.0
    """Sigma of log K (0: every execution makes round(turns_median) calls)."""
    max_turns: int = 48
    """Cap on K."""
    tool_median_s: float = 2.0
    """Median seconds one tool call sleeps."""
    tool_sigma: float = 0.5
    """Sigma of the log of a tool call's seconds."""
    tool_max_s: float = 60.0
    """Cap on one tool call's seconds."""
    max_tokens: int = 16
    """`max_tokens` of each request."""
    temperature: float = 1.0
    model: str = "gyre"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.turns_median) and self.turns_median > 0):
            raise ValueError(f"turns_median={self.turns_median} must be > 0")
        if not (math.isfinite(self.turns_sigma) and self.turns_sigma >= 0):
            raise ValueError(f"turns_sigma={self.turns_sigma} must be >= 0")
        if self.max_turns < 1:
            raise ValueError(f"max_turns={self.max_turns} must be >= 1")
        if not (math.isfinite(self.tool_median_s) and self.tool_median_s >= 0):
            raise ValueError(f"tool_median_s={self.tool_median_s} must be >= 0")
        if not (math.isfinite(self.tool_sigma) and self.tool_sigma >= 0):
            raise ValueError(f"tool_sigma={self.tool_sigma} must be >= 0")
        if not self.tool_max_s >= 0:
            raise ValueError(f"tool_max_s={self.tool_max_s} must be >= 0")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens} must be >= 1")


@dataclass(frozen=True)
class Plan:
    """One execution's draw: K turns and the seconds each turn's tool call sleeps."""

    turns: int
    tool_s: tuple[float, ...]


def plan_seed(text: str) -> int:
    """The seed of an execution named `text`: the first 8 bytes of its SHA-256, big-endian."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def instruction_and_seed(
    args: argparse.Namespace, parser: argparse.ArgumentParser
) -> tuple[str, int]:
    """A scripted agent's task text and seed from its command line (`--instruction`, `--seed`)
    or, as the harness launches it, from `GYRE_INSTRUCTION_FILE` and the execution's name
    (`GYRE_EXECUTION_ID`, else its API key; `plan_seed`). Exits through `parser.error` (status 2)
    when neither is given."""
    instruction = args.instruction
    if instruction is None:
        path = os.environ.get("GYRE_INSTRUCTION_FILE")
        if not path:
            parser.error("give --instruction or set GYRE_INSTRUCTION_FILE")
        instruction = Path(path).read_text(encoding="utf-8")
    seed = args.seed
    if seed is None:
        name = os.environ.get("GYRE_EXECUTION_ID") or os.environ.get("OPENAI_API_KEY")
        if not name:
            parser.error("give --seed or set GYRE_EXECUTION_ID or OPENAI_API_KEY")
        seed = plan_seed(name)
    return instruction, seed


def draw_plan(seed: int, settings: LongtailSettings) -> Plan:
    """K and the tool times drawn from `random.Random(seed)`, in this order.

    K = min(max_turns, max(1, round(X))) with X = lognormvariate(log(turns_median), turns_sigma);
    then K tool times, each min(tool_max_s, lognormvariate(log(tool_median_s), tool_sigma))
    (0 s when tool_median_s is 0).
    """
    rng = random.Random(seed)
    x = rng.lognormvariate(math.log(settings.turns_median), settings.turns_sigma)
    turns = min(settings.max_turns, max(1, round(x)))
    if settings.tool_median_s == 0:
        return Plan(turns, (0.0,) * turns)
    mu = math.log(settings.tool_median_s)
    tool_s = tuple(
        min(settings.tool_max_s, rng.lognormvariate(mu, settings.tool_sigma)) for _ in range(turns)
    )
    return Plan(turns, tool_s)


def _write_result(workspace: Path, plan: Plan, done: int) -> None:
    data = {"turns_planned": plan.turns, "turns_done": done, "finished": done == plan.turns}
    tmp = workspace / f".{RESULT_FILE}.tmp"
    tmp.write_text(json.dumps(data) + "\n")
    os.replace(tmp, workspace / RESULT_FILE)  # a reader never sees a half-written file


def run_plan(
    client: openai.OpenAI,
    instruction: str,
    workspace: Path,
    settings: LongtailSettings,
    plan: Plan,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Make `plan.turns` model calls, each followed by its tool call; return the calls made.

    The history grows by the model's reply (exactly as returned, tool calls included) and the
    tool result: a `tool` message per tool call the reply made, else a `user` message. Raises
    `openai.APIError` when a model call fails (the result file then holds the turns done).
    """
    messages: list[dict] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": instruction},
    ]
    _write_result(workspace, plan, 0)
    for k in range(plan.turns):
        msg = (
            client.chat.completions.create(
                model=settings.model,
                messages=cast("list[ChatCompletionMessageParam]", messages),
                max_tokens=settings.max_tokens,
                temperature=settings.temperature,
            )
            .choices[0]
            .message
        )
        calls = msg.tool_calls or []
        messages.append(assistant_message(msg))
        sleep(plan.tool_s[k])
        result = f"step {k + 1} of {plan.turns} done after {plan.tool_s[k]:.2f} s"
        if calls:
            messages += [{"role": "tool", "tool_call_id": c.id, "content": result} for c in calls]
        else:
            messages.append({"role": "user", "content": f"Tool output: {result}. Continue."})
        _write_result(workspace, plan, k + 1)
    return plan.turns


def longtail_command(settings: LongtailSettings) -> tuple[str, ...]:
    """The harness `agent_command` that runs this agent with `settings`."""
    s = settings
    return (
        *LONGTAIL_AGENT,
        "--turns-median",
        repr(s.turns_median),
        "--turns-sigma",
        repr(s.turns_sigma),
        "--max-turns",
        str(s.max_turns),
        "--tool-median-s",
        repr(s.tool_median_s),
        "--tool-sigma",
        repr(s.tool_sigma),
        "--tool-max-s",
        repr(s.tool_max_s),
        "--max-tokens",
        str(s.max_tokens),
        "--temperature",
        repr(s.temperature),
        "--model",
        s.model,
    )


def main(argv: list[str] | None = None) -> int:
    d = LongtailSettings()
    parser = argparse.ArgumentParser(
        prog="python -m gyre.agents.longtail", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--instruction", help="the task (default: read $GYRE_INSTRUCTION_FILE)")
    parser.add_argument("--workspace", default=".", help="folder that receives result.json")
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the draw (default: hash of $GYRE_EXECUTION_ID, else of $OPENAI_API_KEY)",
    )
    parser.add_argument("--turns-median", type=float, default=d.turns_median)
    parser.add_argument("--turns-sigma", type=float, default=d.turns_sigma)
    parser.add_argument("--max-turns", type=int, default=d.max_turns)
    parser.add_argument("--tool-median-s", type=float, default=d.tool_median_s)
    parser.add_argument("--tool-sigma", type=float, default=d.tool_sigma)
    parser.add_argument("--tool-max-s", type=float, default=d.tool_max_s)
    parser.add_argument("--max-tokens", type=int, default=d.max_tokens)
    parser.add_argument("--temperature", type=float, default=d.temperature)
    parser.add_argument("--model", default=os.environ.get("GYRE_MODEL", d.model))
    parser.add_argument("--request-timeout-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        settings = LongtailSettings(
            turns_median=args.turns_median,
            turns_sigma=args.turns_sigma,
            max_turns=args.max_turns,
            tool_median_s=args.tool_median_s,
            tool_sigma=args.tool_sigma,
            tool_max_s=args.tool_max_s,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            model=args.model,
        )
    except ValueError as exc:
        parser.error(str(exc))
    instruction, seed = instruction_and_seed(args, parser)
    plan = draw_plan(seed, settings)
    logger.info("plan: %d turns, %.1f s of tool time", plan.turns, sum(plan.tool_s))
    client = openai.OpenAI(timeout=args.request_timeout_s, max_retries=2)
    try:
        calls = run_plan(client, instruction, Path(args.workspace), settings, plan)
    except openai.APIError as exc:
        logger.error("model call failed: %s", exc)
        return 3
    logger.info("done after %d model calls", calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
