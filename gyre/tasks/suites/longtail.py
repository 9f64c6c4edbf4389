"""The `longtail` suite: the schedule benchmark's workload, for the agent `gyre.agents.longtail`.

Owns `longtail_task` (one long-horizon chore from a seed and an index; its script verifier scores
`result.json`: turns done / turns planned). Knows nothing about agents, models or the other
suites.
"""

from __future__ import annotations

import json
import random

from gyre.tasks.solution import Solution, Step
from gyre.tasks.suites.files import TEST_SH, TaskFiles

__all__ = ["longtail_task"]


_LONGTAIL_CHECK_PY = '''\
"""Scores result.json: turns done / turns planned; 0 without a readable file."""
import json
import os

passed, total = 0, 1
try:
    with open("result.json") as f:
        data = json.load(f)
    planned, done = int(data["turns_planned"]), int(data["turns_done"])
    if planned >= 1:
        passed, total = max(0, min(done, planned)), planned
except (OSError, ValueError, KeyError, TypeError):
    pass
with open(os.path.join(os.environ["GYRE_REWARD_DIR"], "reward.json"), "w") as f:
    json.dump({"passed": passed, "total": total}, f)
'''

_LT_SYSTEMS = [
    "billing",
    "search",
    "auth",
    "storage",
    "scheduler",
    "gateway",
    "mailer",
    "indexer",
    "cache",
    "ledger",
    "metrics",
    "uploader",
]
_LT_CHORES = [
    "port the {s} service to the new build system",
    "find why the {s} tests are flaky",
    "refactor the {s} module into smaller packages",
    "add tracing to every {s} endpoint",
    "migrate the {s} configuration to TOML",
    "raise the {s} test coverage above 90%",
]


def longtail_task(index: int, seed: int) -> TaskFiles:
    rng = random.Random(f"{seed}:longtail:{index}")
    system = rng.choice(_LT_SYSTEMS)
    chore = rng.choice(_LT_CHORES).format(s=system)
    result = json.dumps({"turns_planned": 1, "turns_done": 1, "finished": True}) + "\n"
    return TaskFiles(
        name=f"{index:03d}-{system}",
        instruction=f"# Long-horizon task\n\nIn the {system} repository, {chore}. "
        "Work in small steps; "
        "each step runs a long tool call.\n",
        difficulty=1,
        tags=("longtail", "benchmark"),
        deadline_s=3600.0,
        max_turns=64,
        token_budget=65536,
        group_size=4,
        environment={},
        tests={"test.sh": TEST_SH, "check.py": _LONGTAIL_CHECK_PY},
        solution=Solution(
            main=[
                Step(
                    tool="write_file",
                    arguments={"path": "result.json", "content": result},
                    tests_passing=1,
                )
            ]
        ),
        verifier_kind="script",
        verifier_timeout_s=60.0,
    )
