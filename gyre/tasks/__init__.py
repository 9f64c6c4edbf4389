"""gyre.tasks: the task format, shipped suites, verifiers and execution outcomes (see
docs/design.md).

Verifiers run as supervised processes of `gyre.sandbox`. Knows nothing of agents: `gyre.agents`
builds on it. The suite generator is imported from `gyre.tasks.suites` only: agents import this
package, and their namespace hides the generator (it would regenerate the shipped suites' hidden
tests)."""

from gyre.tasks.outcome import STOP_REASONS, TERMINATIONS, Outcome, Score, Termination
from gyre.tasks.scorer import VerifierError, score_workspace, verify
from gyre.tasks.solution import Solution, Step, load_solution
from gyre.tasks.task import Task, TaskSpec, load_suite, load_task

__all__ = [
    "Task",
    "TaskSpec",
    "load_task",
    "load_suite",
    "Outcome",
    "Score",
    "Termination",
    "TERMINATIONS",
    "STOP_REASONS",
    "verify",
    "score_workspace",
    "VerifierError",
    "Solution",
    "Step",
    "load_solution",
]
