"""gyre.tasks: the task format, shipped suites, verifiers, supervised processes and execution
outcomes (see DESIGN.md). Knows nothing of agents: `gyre.agents` builds on it. The suite
generator is imported from `gyre.tasks.suites` only: agents import this package, and their
namespace hides the generator (it would regenerate the shipped suites' hidden tests)."""

from gyre.tasks.outcome import STOP_REASONS, TERMINATIONS, Outcome, Score, Termination
from gyre.tasks.sandbox import Limits, ProcessResult, run_supervised
from gyre.tasks.scorer import VerifierError, score_workspace, verify
from gyre.tasks.solution import Solution, Step, load_solution
from gyre.tasks.task import Task, TaskSpec, load_suite, load_task

__all__ = [
    "Task", "TaskSpec", "load_task", "load_suite",
    "Outcome", "Score", "Termination", "TERMINATIONS", "STOP_REASONS",
    "verify", "score_workspace", "VerifierError",
    "Limits", "ProcessResult", "run_supervised",
    "Solution", "Step", "load_solution",
]
