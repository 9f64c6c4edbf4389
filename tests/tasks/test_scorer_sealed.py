"""The sealed verifier's judge on ordinary tests: workspace classes, exceptions, data and
submodules reached through the Python host behave as the tests expect (gyre/tasks/sealed.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gyre.tasks.scorer import verify
from gyre.tasks.task import load_task
from tests.tasks.test_task import make_task

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


TESTS = """
import pytest
from shapes import Stack, EmptyError, make, CONST, pkg_value

def test_stack():
    s = Stack()
    s.push(1); s.push((2, 3))
    assert len(s) == 2 and s.pop() == (2, 3) and s.items == [1]
    assert isinstance(s, Stack) and not isinstance(5, Stack)
    assert 1 in s and list(s) == [1] and bool(s)

def test_raises():
    with pytest.raises(EmptyError):
        Stack().pop()
    with pytest.raises(LookupError):
        Stack().pop()
    with pytest.raises(ValueError, match="bad"):
        make("bad")

def test_data():
    assert CONST == {"a": (1, 2), 3: {4, 5}, "b": b"x", "f": 1.5, "n": None}
    assert pkg_value() == [1, 2]
    assert str(make("p")) == "P(p)" and repr(make("p")) == "P(p)"
    assert make("p") == make("p") and make("p") != make("q")
    assert make("p").name.upper() == "P"

def test_kwargs():
    from shapes.sub import add
    assert add(1, b=2) == 3
"""

SHAPES = """
class EmptyError(LookupError):
    pass
class Stack:
    def __init__(self): self.items = []
    def push(self, x): self.items.append(x)
    def pop(self):
        if not self.items: raise EmptyError("empty")
        return self.items.pop()
    def __len__(self): return len(self.items)
    def __iter__(self): return iter(self.items)
    def __contains__(self, x): return x in self.items
class P:
    def __init__(self, name): self.name = name
    def __eq__(self, o): return isinstance(o, P) and o.name == self.name
    def __hash__(self): return hash(self.name)
    def __repr__(self): return f"P({self.name})"
def make(n):
    if n == "bad": raise ValueError("bad input")
    return P(n)
CONST = {"a": (1, 2), 3: {4, 5}, "b": b"x", "f": 1.5, "n": None}
def pkg_value(): return [1, 2]
"""


async def test_workspace_objects_behave_through_the_host(tmp_path: Path) -> None:
    task = load_task(
        make_task(tmp_path / "t", toml="[verifier]\nnum_tests = 4\n", tests={"test_s.py": TESTS})
    )
    ws = tmp_path / "ws"
    (ws / "shapes").mkdir(parents=True)
    (ws / "shapes" / "__init__.py").write_text(SHAPES)
    (ws / "shapes" / "sub.py").write_text("def add(a, b=0):\n    return a + b\n")
    score = await verify(task, ws)
    assert (score.passed, score.total, score.failed_tests) == (4, 4, ())


async def test_a_hang_at_collection_fails_that_module_only(tmp_path: Path) -> None:
    """A module-level import of workspace code that never returns ends at the call timeout
    (test_timeout_s): that module is a collection error, the other module's test still runs."""
    tests = {
        "test_a.py": "from spin import VALUE\n\n\ndef test_a():\n    assert VALUE == 1\n",
        "test_b.py": "def test_b():\n    from ok import VALUE\n    assert VALUE == 2\n",
    }
    toml = "[verifier]\nnum_tests = 2\ntest_timeout_s = 1.0\n"
    task = load_task(make_task(tmp_path / "t", toml=toml, tests=tests))
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "spin.py").write_text("while True:\n    pass\n")
    (ws / "ok.py").write_text("VALUE = 2\n")
    score = await verify(task, ws)
    assert (score.passed, score.total, score.failed_tests) == (1, 2, ("tests.test_a",))


async def test_workspace_objects_cannot_claim_to_match_expected_values(tmp_path: Path) -> None:
    """Objects whose comparisons, membership and str always succeed: each test below passes on
    a plain-data answer in pytest itself, and fails here (0 of 4 by hand)."""
    tests = {
        "test_c.py": (
            "from cheat import answer\n\n\n"
            "def test_eq():\n    assert answer() == 7\n\n\n"
            "def test_lt():\n    assert answer() < 3\n\n\n"
            "def test_in():\n    assert 7 in answer()\n\n\n"
            "def test_str():\n    assert str(answer()) == 'seven'\n"
        )
    }
    task = load_task(make_task(tmp_path / "t", toml="[verifier]\nnum_tests = 4\n", tests=tests))
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "cheat.py").write_text(
        "class Liar(str):\n"
        "    def __eq__(self, other):\n        return True\n"
        "    __hash__ = str.__hash__\n"
        "    def __lt__(self, other):\n        return True\n"
        "    def __contains__(self, item):\n        return True\n"
        "    def __iter__(self):\n        return iter(())\n"
        "    def __str__(self):\n        return Liar('nope')\n\n\n"
        "def answer():\n    return Liar('x')\n"
    )
    score = await verify(task, ws)
    assert (score.passed, score.total) == (0, 4)


async def test_the_agent_cannot_be_the_judge(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path / "t"))
    (tmp_path / "ws").mkdir()
    with pytest.raises(ValueError, match=r"user=\(65534, 65534\) is the judge's"):
        await verify(task, tmp_path / "ws", user=(65534, 65534))
    with pytest.raises(ValueError, match=r"user=\(300000, 7\) is the judge's"):
        await verify(task, tmp_path / "ws", user=(300_000, 7), judge=(301_000, 7))


@pytest.mark.slow
@pytest.mark.parametrize(
    "suite", ["learnable", "longtail", "multiagent-mini", "nl2repo-mini", "terminal-mini"]
)
async def test_oracle_workspaces_of_shipped_suites_score_full(tmp_path: Path, suite: str) -> None:
    """Every shipped suite's tests run as they did in-process: the oracle's final workspace of
    each of 4 tasks per suite scores all its tests through the judge and the Python host."""
    import random
    import shutil

    from gyre.agents.tools import Workspace
    from gyre.tasks.solution import load_solution
    from gyre.tasks.task import load_suite

    examples = Path(__file__).resolve().parents[2] / "examples" / "tasks"
    tasks = load_suite(examples / suite)
    for i, task in enumerate(random.Random(suite).sample(tasks, min(4, len(tasks)))):
        solution = load_solution(task)
        ws = tmp_path / f"ws{i}"
        shutil.copytree(task.environment_dir, ws)
        tools = Workspace(ws)
        for step in [*solution.main, *(s for steps in solution.sub_agents.values() for s in steps)]:
            if step.tool in ("write_file", "run"):
                getattr(tools, step.tool)(**step.arguments)
        score = await verify(task, ws)
        assert score.all_passed, (task.task_id, score)
