"""Outcome of one execution: how it ended and what the verifier scored.

Owns `Termination`, `Score` (one verifier run) and `Outcome` (one execution, the unit that gets a
reward). docs/design.md invariant 5: every execution ends exactly once as `finished`, stopped at a
limit (`timeout`, `turn_limit`, `token_budget`, `context_exceeded`; partially scored on its
workspace as it stood) or `failed` (infrastructure; carries a reason and stays out of training and
group baselines). Advantages and baselines live in `gyre.rl`; this module knows nothing about
them, nor about processes, HTTP or tokens.
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["Termination", "STOP_REASONS", "TERMINATIONS", "Score", "Outcome"]

Termination = Literal[
    "finished", "timeout", "turn_limit", "token_budget", "context_exceeded", "failed"
]
STOP_REASONS: tuple[Termination, ...] = (
    "timeout",
    "turn_limit",
    "token_budget",
    "context_exceeded",
)
"""Terminations where the agent was stopped from outside and the workspace is partially scored."""
TERMINATIONS: tuple[Termination, ...] = ("finished", *STOP_REASONS, "failed")


class Score(msgspec.Struct, frozen=True, kw_only=True):
    """What one verifier run found: NL2RepoBench's score = passed / total hidden tests."""

    passed: int
    """Hidden tests that passed."""
    total: int
    """Hidden tests in the verifier (declared `num_tests`, or as many as were reported if more)."""
    score: float
    """passed / total in [0, 1]; for `test.sh` verifiers the reward the script wrote."""
    all_passed: bool
    """Every hidden test passed (score == 1.0)."""
    failed_tests: tuple[str, ...] = ()
    """Names of hidden tests that failed, errored or were skipped (pytest verifiers)."""
    verifier_s: float = 0.0
    """Wall seconds the verifier ran."""

    def __post_init__(self) -> None:
        if not 0 <= self.passed <= self.total:
            raise ValueError(f"passed={self.passed} must be in [0, total={self.total}]")
        if not 0.0 <= self.score <= 1.0:
            raise ValueError(f"score={self.score} must be in [0, 1]")


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """How one execution ended and its reward; produced exactly once per dispatched execution."""

    execution_id: str
    task_id: str
    termination: Termination
    score: Score | None = None
    """The verifier's result; None exactly when `termination == "failed"`."""
    failure_reason: str | None = None
    """Why the execution failed (infrastructure); None unless `termination == "failed"`."""
    exit_code: int | None = None
    """The agent's exit status (negative: killed by that signal); None if it never started."""
    model_calls: int = 0
    """Model calls the execution made (as reported to its `ExecutionControl`)."""
    completion_tokens: int = 0
    """Sampled tokens over all its model calls."""
    started_s: float = 0.0
    """Unix time the agent process started, seconds."""
    agent_s: float = 0.0
    """Wall seconds from agent start to agent stop."""
    stdout_tail: str = ""
    """Last bytes of the agent's stdout (decoded, replacement characters for bad UTF-8)."""
    stderr_tail: str = ""

    def __post_init__(self) -> None:
        if (self.termination == "failed") != (self.failure_reason is not None):
            raise ValueError(
                f"termination={self.termination!r} with failure_reason={self.failure_reason!r}: "
                "a reason is required exactly for failed executions"
            )
        if (self.termination == "failed") != (self.score is None):
            raise ValueError(
                f"termination={self.termination!r} with score={self.score!r}: "
                "failed executions have no score, all others have one"
            )

    @property
    def failed(self) -> bool:
        """Infrastructure failure: out of training and out of the group baseline."""
        return self.termination == "failed"

    @property
    def stopped(self) -> bool:
        """Stopped at a limit and partially scored."""
        return self.termination in STOP_REASONS

    @property
    def reward(self) -> float | None:
        """The scalar reward (score in [0, 1]); None for failed executions."""
        return None if self.score is None else self.score.score
