"""Reference solutions: `solution/oracle.json`, the tool calls that solve a task.

Owns `Step`, `Solution` and `load_solution`. A solution is the main conversation's tool calls
plus, for each `delegate` step, the sub-agent's tool calls keyed by the delegated task text.
`tests_passing` after a main step is how many hidden tests pass once that step is done (the
exact partial score of an agent stopped right after it). Used by the scripted oracle in tests
and by the demonstration generator; never shown to agents. Knows nothing about models or HTTP.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gyre.errors import TaskError
from gyre.tasks.task import Task

__all__ = ["Step", "Solution", "load_solution", "encode_solution"]


class Step(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One tool call of a reference solution."""

    tool: str
    """`read_file`, `write_file`, `list_dir`, `run` or `delegate` (`finish` is implied at the
    end)."""
    arguments: dict[str, Any]
    tests_passing: int | None = None
    """Hidden tests passing after this step (main steps of generated tasks)."""


class Solution(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    main: list[Step]
    sub_agents: dict[str, list[Step]] = {}
    """Steps of each sub-agent, keyed by the exact `task` argument of its `delegate` step."""

    def __post_init__(self) -> None:
        for step in self.main:
            if step.tool == "delegate" and step.arguments.get("task") not in self.sub_agents:
                raise ValueError(f"delegate step {step.arguments!r} has no sub-agent steps")


_encoder = msgspec.json.Encoder()


def encode_solution(solution: Solution) -> bytes:
    """`oracle.json` bytes (stable formatting)."""
    return msgspec.json.format(_encoder.encode(solution), indent=1)


def load_solution(task: Task) -> Solution:
    """Read `task`'s `solution/oracle.json`; `TaskError` naming the file if missing or invalid."""
    path = task.solution_dir / "oracle.json"
    try:
        return msgspec.json.decode(path.read_bytes(), type=Solution)
    except FileNotFoundError:
        raise TaskError(f"{path}: missing (the task has no reference solution)") from None
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise TaskError(f"{path}: {exc}") from None
