"""The shipped task suites, generated from a seed: `nl2repo-mini`, `terminal-mini`,
`multiagent-mini`, `learnable`, `learnable-long` (the main job's) and `longtail` (the schedule
benchmark's workload).

`registry` holds `SUITES` (name -> generator of its tasks), `generate_suite` and `generate_all`;
each suite family draws its tasks in its own module (`nl2repo`, `terminal`, `learnable`,
`learnable_long`, `longtail`) and `files` writes them in the format of `gyre.tasks.task`, with a
reference solution whose main steps record how many hidden tests pass after each. Expected values
come from running the reference code, so the oracle scores 1.0 by construction; equal seeds give
byte-identical folders. Re-exports `learnable_examples` and `TaskFiles`. Knows nothing about agents
or models; the whole package is hidden from agents (it would regenerate hidden tests).
"""

from gyre.tasks.suites.files import TaskFiles
from gyre.tasks.suites.learnable import learnable_examples
from gyre.tasks.suites.registry import SUITES, generate_all, generate_suite

__all__ = ["SUITES", "generate_suite", "generate_all", "learnable_examples", "TaskFiles"]
