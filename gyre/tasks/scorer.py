"""Scorers: run a task's hidden verifier on a copy of a workspace and return a `Score`.

Owns `VerifierError`, `verify` and `check_verifier_python` (the run's preflight). The workspace
is copied (with the hidden tests beside it, never inside it) into a private temporary folder, and
the verifier runs there as a supervised subprocess under a time limit, so nothing the verifier or the agent's code does touches the
workspace or the task. pytest verifiers are counted from a JUnit XML report, never from stdout:
score = passed / total (NL2RepoBench), total = the declared `num_tests` or the reported count if
larger; the verifier may run as an unprivileged uid in a mount namespace where only its copy is
writable (`user`, `mounts`: the harness's isolation). `test.sh` verifiers write `reward.txt` (a float in [0, 1]) or `reward.json`
(`{"passed": p, "total": t}` or `{"reward": r}`) into `$GYRE_REWARD_DIR`. Knows nothing about
agents, termination reasons or advantages.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

import anyio

import msgspec

from gyre.sandbox import Limits, Mounts, run_supervised, tail
from gyre.errors import ConfigError, VerifierError
from gyre.tasks.outcome import Score
from gyre.tasks.task import Task

__all__ = ["VerifierError", "verify", "score_workspace", "score_junit", "check_verifier_python"]

_PYTEST_INI = """[pytest]
addopts = -p no:cacheprovider
"""
# The workspace goes at the END of sys.path: a `json.py` or `pytest_timeout.py` the agent wrote
# cannot shadow what the verifier itself imports; the package under test is still found.
_CONFTEST = """import os
import sys

sys.path.append(os.environ["GYRE_WORKSPACE"])
"""


def check_verifier_python(tasks: Sequence[Task], python: str = sys.executable) -> None:
    """Check, before a run starts, that `python` (the interpreter `verify` runs) can import what the
    tasks' verifiers need: `pytest` and `pytest_timeout` when any task has a pytest verifier.

    Raises `ConfigError` naming the first such task, the interpreter and the missing modules;
    without it every execution would fail as "pytest wrote no report" (one subprocess, ~0.3 s)."""
    pytest_task = next((t for t in tasks if t.spec.verifier.kind == "pytest"), None)
    if pytest_task is None:
        return
    probe = "import importlib.util as u; print(' '.join(m for m in ('pytest', 'pytest_timeout') if u.find_spec(m) is None))"
    done = subprocess.run([python, "-I", "-c", probe], capture_output=True, text=True, timeout=60)
    missing = done.stdout.split() if done.returncode == 0 else ["(the interpreter did not run)"]
    if missing:
        raise ConfigError(
            f"task {pytest_task.task_id} has a pytest verifier, but {python} cannot import {', '.join(missing)}: "
            "pip install pytest pytest-timeout into the run's environment"
        )


def score_junit(report: str | os.PathLike[str], num_tests: int | None) -> Score:
    """Count a pytest JUnit XML report: a testcase passed if it has no failure, error or skip.

    Raises `VerifierError` if the report is missing, not XML, or holds no test case.
    """
    try:
        root = ET.parse(report).getroot()
    except FileNotFoundError:
        raise VerifierError(f"pytest wrote no report at {report}") from None
    except ET.ParseError as exc:
        raise VerifierError(f"pytest report {report} is not valid XML: {exc}") from None
    passed = 0
    failed: list[str] = []
    cases = list(root.iter("testcase"))
    for case in cases:
        name = f"{case.get('classname', '')}::{case.get('name', '')}".strip(":")
        if any(child.tag in ("failure", "error", "skipped") for child in case):
            failed.append(name)
        else:
            passed += 1
    if not cases:
        raise VerifierError(f"pytest report {report} holds no test case")
    total = max(num_tests or 0, len(cases))
    return Score(
        passed=passed, total=total, score=passed / total, all_passed=passed == total,
        failed_tests=tuple(failed),
    )


def _score_reward_dir(reward_dir: Path) -> Score:
    txt, js = reward_dir / "reward.txt", reward_dir / "reward.json"
    try:
        if js.exists():
            data = json.loads(js.read_text())
            if "passed" in data and "total" in data:
                passed, total = int(data["passed"]), int(data["total"])
                if total <= 0 or not 0 <= passed <= total:
                    raise ValueError(f"passed={passed}, total={total}")
                return Score(passed=passed, total=total, score=passed / total, all_passed=passed == total)
            reward = float(data["reward"])
        elif txt.exists():
            reward = float(txt.read_text().strip())
        else:
            raise VerifierError(f"test.sh wrote neither reward.txt nor reward.json in {reward_dir}")
    except (ValueError, KeyError, TypeError) as exc:
        raise VerifierError(f"test.sh wrote an unusable reward: {exc}") from None
    if not (math.isfinite(reward) and 0.0 <= reward <= 1.0):
        raise VerifierError(f"test.sh wrote reward={reward}, outside [0, 1]")
    return Score(passed=int(reward == 1.0), total=1, score=reward, all_passed=reward == 1.0)


def _special_files(folder: str, names: list[str]) -> set[str]:
    """FIFOs, sockets and devices in a workspace: not copied for the verifier (copying a FIFO
    blocks or fails, which would let an agent fail its own execution out of training)."""
    return {n for n in names if not stat.S_ISDIR(m := os.lstat(os.path.join(folder, n)).st_mode)
            and not stat.S_ISREG(m) and not stat.S_ISLNK(m)}


def _prepare(task: Task, workspace: Path, user: tuple[int, int] | None) -> Path:
    """Copy workspace and hidden tests into a fresh private folder (blocking; run in a thread);
    with `user`, everything but `pytest.ini` and `conftest.py` becomes that user's."""
    scratch = Path(tempfile.mkdtemp(prefix="gyre-verify-"))  # mode 0700
    try:
        shutil.copytree(workspace, scratch / "workspace", symlinks=True, ignore=_special_files)
        shutil.copytree(task.tests_dir, scratch / "tests", symlinks=True)
        (scratch / "pytest.ini").write_text(_PYTEST_INI)
        (scratch / "conftest.py").write_text(_CONFTEST)
        (scratch / "verifier").mkdir()
        (scratch / "tmp").mkdir()
        if user is not None:
            for top in ("workspace", "tests", "verifier", "tmp"):
                os.lchown(scratch / top, *user)
                for dirpath, dirnames, filenames in os.walk(scratch / top):
                    for name in dirnames + filenames:
                        os.lchown(os.path.join(dirpath, name), *user)
            # readable, not writable: Python imports conftest.py from a folder it can list
            os.chmod(scratch, 0o755)
    except BaseException:  # nothing is left behind in /tmp
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return scratch


async def verify(
    task: Task,
    workspace: str | os.PathLike[str],
    *,
    limits: Limits = Limits(),
    python: str = sys.executable,
    user: tuple[int, int] | None = None,
    mounts: Mounts | None = None,
) -> Score:
    """Run `task`'s hidden verifier on a copy of `workspace`; the workspace is never modified.

    `user` = (uid, gid): the verifier (and the agent code its tests import) runs as that user,
    owning its copy (needs root). `mounts`: it runs in that mount namespace, with its copy added
    to `mounts.writable` (so with `read_only` it writes nowhere else). The verifier gets `task.spec.verifier.timeout_s` seconds of wall clock; each pytest test
    `test_timeout_s`. Raises `VerifierError` when it hangs past its limit, crashes (pytest usage
    or internal error, no tests collected) or reports nothing usable; `FileNotFoundError` if the
    workspace does not exist.
    """
    workspace = Path(workspace)
    if not workspace.is_dir():
        raise FileNotFoundError(f"workspace {workspace} does not exist")
    spec = task.spec.verifier
    scratch = await anyio.to_thread.run_sync(_prepare, task, workspace, user)
    if mounts is not None:
        mounts = msgspec.structs.replace(mounts, writable=(*mounts.writable, str(scratch)))
    try:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "HOME": str(scratch / "tmp"),
            "TMPDIR": str(scratch / "tmp"),
            "GYRE_WORKSPACE": str(scratch / "workspace"),
            "GYRE_TESTS_DIR": str(scratch / "tests"),
            "GYRE_REWARD_DIR": str(scratch / "verifier"),
            "GYRE_PYTHON": python,
            # only the plugins the verifier needs: faster start, and no plugin of the node's env
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        }
        if spec.kind == "pytest":
            argv = [
                python, "-I", "-m", "pytest", "-c", str(scratch / "pytest.ini"),
                "--rootdir", str(scratch), "--junitxml", str(scratch / "verifier" / "junit.xml"),
                "-q", "-p", "pytest_timeout", "--continue-on-collection-errors", "--timeout", str(spec.test_timeout_s),
                str(scratch / "tests"),
            ]
        else:
            argv = ["bash", str(scratch / "tests" / "test.sh")]
        t0 = time.monotonic()
        with open(scratch / "verifier" / "output.log", "wb") as out:
            result = await run_supervised(
                argv, cwd=scratch / "workspace", env=env, limits=limits,
                deadline_s=spec.timeout_s, stdout=out, stderr=out, user=user, mounts=mounts,
            )
        verifier_s = time.monotonic() - t0
        output = tail(scratch / "verifier" / "output.log", 2000)
        if result.ended != "exited":
            raise VerifierError(
                f"verifier of {task.task_id} hung: killed after timeout_s={spec.timeout_s}"
            )
        if spec.kind == "pytest":
            # 0: all passed, 1: some failed; 2-5: interrupted, internal, usage, nothing collected.
            if result.exit_code not in (0, 1):
                raise VerifierError(
                    f"pytest verifier of {task.task_id} crashed (exit {result.exit_code}): {output[-800:]}"
                )
            score = score_junit(scratch / "verifier" / "junit.xml", spec.num_tests)
        else:
            try:
                score = _score_reward_dir(scratch / "verifier")
            except VerifierError as exc:
                raise VerifierError(f"{exc} (exit {result.exit_code}): {output[-800:]}") from None
        return Score(
            passed=score.passed, total=score.total, score=score.score, all_passed=score.all_passed,
            failed_tests=score.failed_tests, verifier_s=verifier_s,
        )
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(lambda: shutil.rmtree(scratch, ignore_errors=True))


async def score_workspace(
    task: Task,
    workspace: str | os.PathLike[str],
    *,
    limits: Limits = Limits(),
    template_ok: dict[str, bool] | None = None,
    user: tuple[int, int] | None = None,
    mounts: Mounts | None = None,
) -> Score:
    """`verify` (`limits`, `user` and `mounts` passed on), blaming the workspace when the verifier breaks on it but not on the template.

    Agent code runs inside the verifier (the tests import it), so it can crash or hang it; that
    must score 0, not drop the execution from training. When `verify` raises `VerifierError`,
    the verifier is run once on the task's pristine `environment/` (cached per task in
    `template_ok`): if it works there, the workspace is at fault and the score is 0 of
    `num_tests` (or 1); if it fails there too, the `VerifierError` is raised (infrastructure).
    """
    try:
        return await verify(task, workspace, limits=limits, user=user, mounts=mounts)
    except VerifierError as exc:
        cache = template_ok if template_ok is not None else {}
        if task.root not in cache:
            try:
                await verify(task, task.environment_dir, limits=limits, user=user, mounts=mounts)
                cache[task.root] = True
            except VerifierError:
                cache[task.root] = False
        if not cache[task.root]:
            raise
        total = task.spec.verifier.num_tests or 1
        return Score(passed=0, total=total, score=0.0, all_passed=False,
                     failed_tests=(f"verifier broke on this workspace only: {exc}"[:500],))
