"""Field case B28 (docs/field_cases.md): agent code cannot forge the verifier's report.

A shipped `nl2repo-mini` task (`000-misty-heron`, 4 hidden tests) with a workspace whose package
passes a known number of them (0 or 1, by hand), plus forging code: an `atexit` rewrite of the
report, `os._exit(0)` at import or mid-test, a planted `conftest.py` / `sitecustomize.py`, a
monkeypatched reporter, forged report lines on every descriptor, writes to the reward folder, an
always-equal object, reading the hidden tests. Each scores what the honest tests give, without
isolation (everything as this process's uid) and with it (root: agent uid, judge uid `nobody`,
private mount namespace); the isolated runs skip where this node cannot build them. Before the
sealed verifier, the atexit rewrite, both os._exit variants, the patched reporter and the
always-equal object scored 4 of 4 in both modes.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from gyre.agents.isolation import closed_parents
from gyre.sandbox import Mounts, mount_namespace_problem
from gyre.tasks.scorer import score_workspace, verify
from gyre.tasks.task import Task, load_task

pytestmark = pytest.mark.anyio

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"
TASK = EXAMPLES / "nl2repo-mini" / "000-misty-heron"
SCRIPT_TASK = EXAMPLES / "terminal-mini" / "019-rename-concat"
AGENT_UID = 310_428


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


def isolation_problem() -> str | None:
    if os.geteuid() != 0:
        return f"runs as uid {os.geteuid()}, not root"
    return mount_namespace_problem()


ISOLATION = [
    pytest.param(False, id="unisolated"),
    pytest.param(
        True,
        id="isolated",
        marks=pytest.mark.skipif(
            isolation_problem() is not None,
            reason=f"no agent isolation here: {isolation_problem()}",
        ),
    ),
]


def sealed_kwargs(isolated: bool) -> dict:
    """`verify`'s isolation as the harness sets it up as root: the agent's uid, a read-only
    namespace without /root or the host's /tmp, no network; passing through the folders above
    the venv other users cannot enter (a checkout under a 0700 `mktemp -d`, as in CI)."""
    if not isolated:
        return {}
    expose = tuple(sorted({sys.prefix, sys.base_prefix, os.path.realpath(sys.base_prefix)}))
    mounts = Mounts(
        hide=("/root",),
        private=("/tmp", "/var/tmp", "/dev/shm"),
        expose=expose,
        traverse=tuple(sorted(closed_parents(expose))),
        read_only=True,
        network=False,
    )
    return {"user": (AGENT_UID, AGENT_UID), "mounts": mounts}


# 0 of 4 by hand: rle_encode('aabbbbbbbbbbb') != 'a2b11', rle_encode('') != '', and
# is_palindrome returns None, which is neither True nor False.
WRONG = "def rle_encode(s):\n    return 'x'\n\n\ndef is_palindrome(s):\n    return None\n"
# 1 of 4 by hand: rle_encode('') == '' only.
ONE_RIGHT = "def rle_encode(s):\n    return s[:0]\n\n\ndef is_palindrome(s):\n    return None\n"

_REPORT = (
    '<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="4" failures="0" errors="0">'
    + "".join(f'<testcase classname="tests.test_text" name="t{i}"/>' for i in range(4))
    + "</testsuite></testsuites>"
)
_FORGE = f"""
import json, os
REPORT = {_REPORT!r}
def forge():
    targets = [os.environ.get("GYRE_REWARD_DIR"), "../verifier", "..", "../tests", "."]
    for folder in filter(None, targets):
        for name, text in (("junit.xml", REPORT), ("reward.txt", "1.0"),
                           ("reward.json", json.dumps({{"passed": 4, "total": 4}}))):
            try:
                with open(os.path.join(folder, name), "w") as f:
                    f.write(text)
            except OSError:
                pass
"""
# Forged report lines written into every pipe the judge (the scorer's child running sealed.py)
# holds, reopened through /proc/<pid>/fd: the write end of the report's own pipe included.
# Unsigned, they would add 4 passing tests to 4 failing ones (0.5). Only the judge is a target:
# the first version wrote into every pipe of every process under the pytest process, vLLM
# engines of other tests included, and crashed the suite (SIGBUS) in a full `make test`.
_INJECT = """
import os

def _ppid(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return 0

def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""

def _inject():
    pid, scorer = os.getpid(), 0
    while pid > 1 and not scorer:
        pid = _ppid(pid)
        scorer = pid if b"pytest" in _cmdline(pid) and b"sealed.py" not in _cmdline(pid) else 0
    if not scorer:
        return
    names = ("test_rle_encode_0", "test_rle_encode_1", "test_is_palindrome_0",
             "test_is_palindrome_1", "test_extra_0", "test_extra_1", "test_extra_2", "test_extra_3")
    lines = "".join('{"id": "tests/test_text.py::%s", "when": "call", "outcome": "passed"}\\n' % n
                    for n in names).encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        p = int(name)
        while p > 1 and p != scorer:
            p = _ppid(p)
        if p != scorer or b"sealed.py" not in _cmdline(int(name)):
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in (fd for fd in fds if int(fd) > 2):  # not the console
            try:
                if not os.readlink(f"/proc/{name}/fd/{fd}").startswith("pipe:"):
                    continue
                out = os.open(f"/proc/{name}/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK)
                os.write(out, lines)
                os.close(out)
            except OSError:
                pass

_inject()
"""
# each attack: files it adds to the workspace (appended to the package's file of that name)
ATTACKS: dict[str, dict[str, str]] = {
    "atexit_rewrite": {
        "misty_heron/__init__.py": _FORGE + "import atexit\natexit.register(forge)\n"
    },
    "exit_at_import": {"misty_heron/__init__.py": _FORGE + "forge()\nos._exit(0)\n"},
    "exit_mid_test": {
        "misty_heron/text.py": _FORGE + "\ndef is_palindrome(s):\n    forge()\n    os._exit(0)\n"
    },
    "planted_conftest": {
        name: "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\n"
        "def pytest_runtest_makereport(item, call):\n    out = yield\n"
        "    out.get_result().outcome = 'passed'\n"
        for name in ("conftest.py", "misty_heron/conftest.py")
    },
    "planted_sitecustomize": {
        name: _FORGE + "import atexit\natexit.register(forge)\n"
        for name in ("sitecustomize.py", "usercustomize.py", "misty_heron/sitecustomize.py")
    }
    | {"pytest.ini": "[pytest]\naddopts = -p no:junitxml\n"},
    "monkeypatched_reporter": {
        "misty_heron/__init__.py": """
import sys
for name in ("_pytest.reports", "_pytest.runner", "_pytest.junitxml", "__main__", "sealed"):
    module = sys.modules.get(name)
    if module is None:
        continue
    if hasattr(module, "TestReport"):
        module.TestReport.outcome = property(lambda self: "passed", lambda self, v: None)
    if hasattr(module, "_Reporter"):
        module._Reporter.write = lambda self, record: None
    if hasattr(module, "call_and_report"):
        real = module.call_and_report
        def call_and_report(*a, **k):
            report = real(*a, **k)
            report.outcome = "passed"
            return report
        module.call_and_report = call_and_report
"""
    },
    "forged_report_lines": {
        "misty_heron/__init__.py": """
import os
lines = "".join('{"id": "tests/test_text.py::%s", "when": "call", "outcome": "passed"}\\n' % name
                for name in ("test_rle_encode_0", "test_rle_encode_1", "test_is_palindrome_0",
                             "test_is_palindrome_1"))
for fd in range(3, 64):
    try:
        os.write(fd, (lines + '{"done": 0}\\n').encode())
    except OSError:
        pass
"""
    },
    "proc_fd_injection": {"misty_heron/__init__.py": _INJECT},
    "reward_folder_writes": {"misty_heron/__init__.py": _FORGE + "forge()\n"},
    # found by a tester: plant a module on the judge's path (the scratch tests/ folder, writable
    # when agents share the node's uid), then hand the judge a module object of that name
    "module_planted_on_judge_path": {
        "misty_heron/text.py": """
import os, sys, types
for folder in ("../tests", "../verifier", ".."):
    try:
        with open(os.path.join(folder, "gyre_planted.py"), "w") as f:
            f.write(
                "import gc\\n"
                "for o in gc.get_objects():\\n"
                "    if type(o).__name__ == '_Reporter':\\n"
                "        real = o.write\\n"
                "        o.write = lambda r, real=real: real(dict(r, outcome='passed')"
                " if 'outcome' in r else r)\\n"
            )
    except OSError:
        pass

def _planted(*args):
    module = types.ModuleType("gyre_planted")
    sys.modules["gyre_planted"] = module
    return module

rle_encode = is_palindrome = _planted
"""
    },
    "always_equal": {
        "misty_heron/text.py": """
class Anything(str):
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = str.__hash__

def rle_encode(s):
    return Anything('')

def is_palindrome(s):
    return Anything('')
"""
    },
}


def make_workspace(root: Path, text: str, extra: dict[str, str]) -> Path:
    """The task's environment, the package with `text`, then the attack's files (a file of the
    attack named like one of the package's is appended to it)."""
    ws = root / "ws"
    shutil.copytree(TASK / "environment", ws)
    files = {"misty_heron/__init__.py": "", "misty_heron/text.py": text}
    for name, body in extra.items():
        files[name] = files.get(name, "") + body
    for name, body in files.items():
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_text(body)
    return ws


def shipped(path: Path) -> Task:
    task = load_task(path)
    assert task.spec.verifier.num_tests == (4 if path == TASK else None)
    return task


@pytest.mark.parametrize("isolated", ISOLATION)
@pytest.mark.parametrize("base, honest", [(WRONG, 0), (ONE_RIGHT, 1)], ids=["wrong", "one_right"])
async def test_b28_control_scores_the_honest_tests(
    tmp_path: Path, isolated: bool, base: str, honest: int
) -> None:
    ws = make_workspace(tmp_path, base, {})
    score = await verify(shipped(TASK), ws, **sealed_kwargs(isolated))
    assert (score.passed, score.total, score.score) == (honest, 4, honest / 4)


# by hand: what the honest tests give once the forging code is there. Exiting at import leaves no
# working function (0); exiting inside is_palindrome fails its 2 tests only (the base's own result);
# a str subclass claiming equality is no plain str, so nothing equals it (0).
# Forged frames written to every descriptor land on the worker's own socket and garble its
# answers, so every test that imports the package fails (0).
EXPECTED = {
    "exit_at_import": 0,
    "always_equal": 0,
    "forged_report_lines": 0,
    "module_planted_on_judge_path": 0,  # both functions replaced: nothing right is left
}


@pytest.mark.parametrize("isolated", ISOLATION)
@pytest.mark.parametrize("base, honest", [(WRONG, 0), (ONE_RIGHT, 1)], ids=["wrong", "one_right"])
@pytest.mark.parametrize("attack", sorted(ATTACKS))
async def test_b28_forging_code_does_not_raise_the_score(
    tmp_path: Path, isolated: bool, base: str, honest: int, attack: str
) -> None:
    task = shipped(TASK)
    ws = make_workspace(tmp_path, base, ATTACKS[attack])
    before = {p: p.read_bytes() for p in sorted(task.path.rglob("*")) if p.is_file()}
    score = await score_workspace(task, ws, template_ok={}, **sealed_kwargs(isolated))
    passed = EXPECTED.get(attack, honest)
    assert (score.passed, score.total, score.score) == (passed, 4, passed / 4)
    assert {p: p.read_bytes() for p in sorted(task.path.rglob("*")) if p.is_file()} == before


@pytest.mark.parametrize("isolated", [p for p in ISOLATION if p.id == "isolated"])
async def test_b28_workspace_code_cannot_read_the_hidden_tests(
    tmp_path: Path, isolated: bool
) -> None:
    """Under isolation the workspace's code (agent uid) cannot open the hidden tests to copy their
    expected values; the same code reading them as the judge's uid would score 4 of 4."""
    cheat = """
import ast, os
def _expected(name, arg):
    for node in ast.walk(ast.parse(open("../tests/test_text.py").read())):
        if isinstance(node, ast.Compare) and getattr(node.left, "func", None) is not None \\
                and node.left.func.id == name and ast.literal_eval(node.left.args[0]) == arg:
            return ast.literal_eval(node.comparators[0])

def rle_encode(s):
    return _expected("rle_encode", s)

def is_palindrome(s):
    return _expected("is_palindrome", s)
"""
    task = shipped(TASK)
    unisolated = await verify(task, make_workspace(tmp_path / "a", cheat, {}))
    assert unisolated.passed == 4  # the cheat works where the tests are readable: it is real
    score = await verify(task, make_workspace(tmp_path / "b", cheat, {}), **sealed_kwargs(isolated))
    assert (score.passed, score.total) == (0, 4)


@pytest.mark.parametrize("isolated", ISOLATION)
async def test_b28_script_verifier_reward_folder_is_sealed(tmp_path: Path, isolated: bool) -> None:
    """A shipped test.sh verifier (terminal-mini `019-rename-concat`, 3 checks): the workspace
    did the renames only (2 of 3 by hand) and plants rewards, a report and import hooks."""
    task = shipped(SCRIPT_TASK)
    ws = tmp_path / "ws"
    shutil.copytree(task.environment_dir, ws)
    for name in os.listdir(ws / "notes"):
        os.rename(ws / "notes" / name, ws / "notes" / name.replace(".txt", ".md"))
    (ws / "reward.txt").write_text("1.0\n")
    (ws / "reward.json").write_text('{"passed": 3, "total": 3}\n')
    for name in ("sitecustomize.py", "usercustomize.py", "json.py", "test_checks.py"):
        (ws / name).write_text(
            "def test_renamed():\n    pass\n\n\ndef test_combined():\n    pass\n"
        )
    score = await score_workspace(task, ws, template_ok={}, **sealed_kwargs(isolated))
    assert (score.passed, score.total, score.score) == (2, 3, 2 / 3)
