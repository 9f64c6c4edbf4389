"""Scorers: run a task's hidden verifier on a copy of a workspace and return a `Score`.

Owns `verify`, `score_workspace`, `score_report` and `check_verifier_python`. The workspace and
the hidden tests are copied into a private folder and the verifier runs there, supervised and
sealed (docs/design.md, "The sealed verifier"): pytest runs in the judge (`gyre.tasks.sealed`, as
`JUDGE_USER` when agents have uids), the workspace's code only in a Python host as the agent's
uid, and each test's outcome reaches the scorer on a pipe it owns. score = passed / total (total:
the declared `num_tests` or the reported count if larger). `test.sh` verifiers run as the judge
and write `reward.txt` or `reward.json` into a folder only the judge may write. Knows nothing
about agents, termination reasons or advantages.
"""

from __future__ import annotations

import functools
import hmac
import inspect
import json
import math
import os
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
import msgspec

from gyre.errors import ConfigError, VerifierError
from gyre.sandbox import Limits, Mounts, pyhost, run_supervised, tail
from gyre.tasks import sealed
from gyre.tasks.outcome import Score
from gyre.tasks.task import Task

__all__ = [
    "JUDGE_USER",
    "VerifierError",
    "verify",
    "score_workspace",
    "score_report",
    "check_verifier_python",
]

_PYTEST_INI = """[pytest]
addopts = -p no:cacheprovider
"""

JUDGE_USER = (65534, 65534)
"""uid and gid of the verifier's trusted side when agents have uids of their own: `nobody`, an
existing user, which no agent uid ever is (agent uids are ones the node does not have)."""


def check_verifier_python(tasks: Sequence[Task], python: str = sys.executable) -> None:
    """Check, before a run starts, that `python` (the interpreter `verify` runs) can import what the
    tasks' verifiers need: `pytest` and `pytest_timeout` when any task has a pytest verifier.

    Raises `ConfigError` naming the first such task, the interpreter and the missing modules (or
    why the interpreter cannot be started);
    without it every execution would fail as "pytest wrote no report" (one subprocess, ~0.3 s)."""
    pytest_task = next((t for t in tasks if t.spec.verifier.kind == "pytest"), None)
    if pytest_task is None:
        return
    probe = (
        "import importlib.util as u; "
        "print(' '.join(m for m in ('pytest', 'pytest_timeout') if u.find_spec(m) is None))"
    )
    try:
        done = subprocess.run(
            [python, "-I", "-c", probe], capture_output=True, text=True, timeout=60
        )
    except OSError as exc:  # not there, not executable, not runnable by this user
        raise ConfigError(
            f"task {pytest_task.task_id} has a pytest verifier, but its interpreter {python} "
            f"cannot be started: {exc.strerror or exc}"
        ) from None
    missing = done.stdout.split() if done.returncode == 0 else ["(the interpreter did not run)"]
    if missing:
        raise ConfigError(
            f"task {pytest_task.task_id} has a pytest verifier, but {python} cannot import "
            f"{', '.join(missing)}: "
            "pip install pytest pytest-timeout into the run's environment"
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
                return Score(
                    passed=passed, total=total, score=passed / total, all_passed=passed == total
                )
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


def score_report(lines: bytes, num_tests: int | None, key: bytes) -> Score:
    """Count the sealed verifier's report (`gyre.tasks.sealed`, one JSON line per test phase,
    signed with `key`; a line with a wrong signature is left out): a test passed if its call
    passed and no phase of it failed; a module that could not be collected counts as one failed
    test. total = `num_tests` or the reported count if larger.

    Raises `VerifierError` if the report is cut short (no closing record) or holds no test."""
    seen: dict[str, None] = {}  # in report order
    not_ok: set[str] = set()
    called_ok: set[str] = set()
    done = False
    for line in lines.decode(errors="replace").splitlines():
        body = line.rpartition(" ")[0]
        if not hmac.compare_digest(sealed.sign(key, body), line):
            continue  # not the judge's
        record = json.loads(body)
        if "done" in record:
            done = True
            continue
        seen[record["id"]] = None
        if record["outcome"] != "passed":
            not_ok.add(record["id"])
        elif record["when"] == "call":
            called_ok.add(record["id"])
    if not done:
        raise VerifierError("the verifier's report ends before its closing record")
    if not seen:
        raise VerifierError("the verifier's report holds no test case")
    outcomes = {_dotted(name): name in called_ok and name not in not_ok for name in seen}
    failed = tuple(name for name, ok in outcomes.items() if not ok)
    passed = len(outcomes) - len(failed)
    total = max(num_tests or 0, len(outcomes))
    return Score(
        passed=passed,
        total=total,
        score=passed / total,
        all_passed=passed == total,
        failed_tests=failed,
    )


def _dotted(nodeid: str) -> str:
    """`tests/test_a.py::TestX::test_b` as JUnit names it: `tests.test_a.TestX::test_b`."""
    path, *inner = nodeid.split("::")
    module = path.removesuffix(".py").replace("/", ".")
    return "::".join([".".join([module, *inner[:-1]]), *inner[-1:]])


def _special_files(folder: str, names: list[str]) -> set[str]:
    """FIFOs, sockets and devices in a workspace: not copied for the verifier (copying a FIFO
    blocks or fails, which would let an agent fail its own execution out of training)."""
    return {
        n
        for n in names
        if not stat.S_ISDIR(m := os.lstat(os.path.join(folder, n)).st_mode)
        and not stat.S_ISREG(m)
        and not stat.S_ISLNK(m)
    }


def _walk(top: Path):
    yield str(top), True
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames:
            yield os.path.join(dirpath, name), True
        for name in filenames:
            yield os.path.join(dirpath, name), False


def _hand_out(top: Path, uid: int, gid: int, dir_mode: int, file_mode: int, *, keep: bool) -> None:
    """chown `top` and all below it; folders get `dir_mode`, files `file_mode` (added to their own
    owner bits when `keep`); symlinks are chowned, never followed."""
    for path, is_dir in _walk(top):
        os.lchown(path, uid, gid)
        if os.path.islink(path):
            continue
        mode = dir_mode if is_dir else file_mode
        if keep:
            mode |= stat.S_IMODE(os.lstat(path).st_mode) & 0o700
        os.chmod(path, mode)


def _prepare(
    task: Task, workspace: Path, agent: tuple[int, int] | None, judge: tuple[int, int] | None
) -> Path:
    """Copy workspace and hidden tests into a fresh private folder (blocking; run in a thread),
    with the sealed verifier's scripts (`sealed/`, root's). With `agent` and `judge` (uids): the
    workspace copy is the agent's, shared with the judge's group; the tests and `verifier/` (the
    reward folder) are the judge's alone; `tmp/` (the host's HOME) is the agent's."""
    scratch = Path(tempfile.mkdtemp(prefix="gyre-verify-"))  # mode 0700
    try:
        shutil.copytree(workspace, scratch / "workspace", symlinks=True, ignore=_special_files)
        shutil.copytree(task.tests_dir, scratch / "tests", symlinks=True)
        (scratch / "sealed").mkdir()
        for module in (pyhost, sealed):
            source = inspect.getfile(module)  # module.__file__, never None for a source file
            shutil.copyfile(source, scratch / "sealed" / Path(source).name)
        (scratch / "pytest.ini").write_text(_PYTEST_INI)
        (scratch / "verifier").mkdir()
        (scratch / "tmp").mkdir()
        if agent is not None and judge is not None:
            _hand_out(scratch / "workspace", agent[0], judge[1], 0o2770, 0o060, keep=True)
            _hand_out(scratch / "tmp", *agent, 0o700, 0o600, keep=False)
            _hand_out(scratch / "tests", 0, judge[1], 0o750, 0o640, keep=False)
            _hand_out(scratch / "verifier", *judge, 0o700, 0o600, keep=False)
            _hand_out(scratch / "sealed", 0, 0, 0o755, 0o644, keep=False)
            os.chmod(scratch, 0o755)  # pytest lists it (its rootdir): names only, no content
    except BaseException:  # nothing is left behind in /tmp
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return scratch


def _read_all(fd: int) -> bytes:
    with os.fdopen(fd, "rb") as f:
        return f.read()


async def _run_sealed_pytest(
    task: Task,
    scratch: Path,
    env: dict[str, str],
    out,
    *,
    limits: Limits,
    python: str,
    agent: tuple[int, int] | None,
    judge: tuple[int, int] | None,
    mounts: Mounts | None,
):
    """The judge (pytest with `sealed.py`, as `judge`) and the Python host (as `agent`) side by
    side, joined by a socket pair; the judge's report comes back on a pipe. Returns the judge's
    `ProcessResult`, its report and the report's key (given to the judge alone, on a pipe it
    empties before any workspace code runs)."""
    spec = task.spec.verifier
    judge_end, host_end = (s.detach() for s in socket.socketpair())
    host_env = {**env, "HOME": str(scratch / "tmp"), "TMPDIR": str(scratch / "tmp")}
    for name in ("GYRE_TESTS_DIR", "GYRE_REWARD_DIR"):
        host_env.pop(name)
    host_argv = [
        python,
        "-I",
        "-S",
        str(scratch / "sealed" / "pyhost.py"),
        str(host_end),
        str(scratch / "workspace"),
    ]
    host_done = anyio.Event()
    report: list[bytes] = []
    key = secrets.token_bytes(32)
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            functools.partial(
                run_supervised,
                host_argv,
                cwd=scratch / "workspace",
                env=host_env,
                limits=limits,
                deadline_s=spec.timeout_s + 30,
                stdout=out,
                stderr=out,
                user=agent,
                mounts=mounts,
                stop=host_done,
                pass_fds=[host_end],
            )
        )
        report_r, report_w = os.pipe()
        key_r, key_w = os.pipe()
        os.write(key_w, key)
        os.close(key_w)

        async def read_report() -> None:
            report.append(await anyio.to_thread.run_sync(_read_all, report_r))

        tg.start_soon(read_report)
        judge_env = {
            **env,
            "HOME": str(scratch / "verifier"),
            "TMPDIR": str(scratch / "verifier"),
            "GYRE_HOST_FD": str(judge_end),
            "GYRE_REPORT_FD": str(report_w),
            "GYRE_KEY_FD": str(key_r),
            "GYRE_CALL_TIMEOUT_S": str(spec.test_timeout_s),
        }
        argv = [
            python,
            "-I",
            str(scratch / "sealed" / "sealed.py"),
            "-c",
            str(scratch / "pytest.ini"),
            "--rootdir",
            str(scratch),
            "-q",
            "-p",
            "pytest_timeout",
            "--continue-on-collection-errors",
            "--timeout",
            str(spec.test_timeout_s),
            str(scratch / "tests"),
        ]
        try:
            result = await run_supervised(
                argv,
                cwd=scratch / "workspace",
                env=judge_env,
                limits=limits,
                deadline_s=spec.timeout_s,
                stdout=out,
                stderr=out,
                user=judge,
                mounts=mounts,
                pass_fds=[judge_end, report_w, key_r],
            )
        finally:
            host_done.set()
    return result, report[0], key


async def verify(
    task: Task,
    workspace: str | os.PathLike[str],
    *,
    limits: Limits = Limits(),
    python: str = sys.executable,
    user: tuple[int, int] | None = None,
    mounts: Mounts | None = None,
    judge: tuple[int, int] = JUDGE_USER,
) -> Score:
    """Run `task`'s hidden verifier on a copy of `workspace`; the workspace is never modified.

    `user` = (uid, gid) of the agent (needs root): the workspace's code runs as that user, and
    the tests, test.sh and the report as `judge`'s (never an agent's). `mounts`: both run in that
    mount namespace, with the copy added to `mounts.writable` (so with `read_only` they write
    nowhere else). The verifier gets `task.spec.verifier.timeout_s` seconds of wall clock; each
    pytest test `test_timeout_s`, each call into the workspace's code as long. Raises
    `VerifierError` when it hangs past its limit, crashes (pytest usage or internal error, no
    tests collected) or reports nothing usable; `FileNotFoundError` if the workspace does not
    exist; `ValueError` if `user` shares the judge's uid or gid.
    """
    workspace = Path(workspace)
    if not workspace.is_dir():
        raise FileNotFoundError(f"workspace {workspace} does not exist")
    spec = task.spec.verifier
    if user is not None and (user[0] == judge[0] or user[1] == judge[1]):
        raise ValueError(f"user={user!r} is the judge's ({judge=}): the tests' uid must be its own")
    sealed_judge = judge if user is not None else None
    scratch = await anyio.to_thread.run_sync(_prepare, task, workspace, user, sealed_judge)
    if mounts is not None:
        mounts = msgspec.structs.replace(mounts, writable=(*mounts.writable, str(scratch)))
    try:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "HOME": str(scratch / "verifier"),
            "TMPDIR": str(scratch / "verifier"),
            "GYRE_WORKSPACE": str(scratch / "workspace"),
            "GYRE_TESTS_DIR": str(scratch / "tests"),
            "GYRE_REWARD_DIR": str(scratch / "verifier"),
            "GYRE_PYTHON": python,
            # only the plugins the verifier needs: faster start, and no plugin of the node's env
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        }
        t0 = time.monotonic()
        # root's, opened here: the log is for error messages only, never read as a score
        with open(scratch / "output.log", "wb") as out:
            if spec.kind == "pytest":
                result, report, key = await _run_sealed_pytest(
                    task,
                    scratch,
                    env,
                    out,
                    limits=limits,
                    python=python,
                    agent=user,
                    judge=sealed_judge,
                    mounts=mounts,
                )
            else:
                result = await run_supervised(
                    ["bash", str(scratch / "tests" / "test.sh")],
                    cwd=scratch / "workspace",
                    env=env,
                    limits=limits,
                    deadline_s=spec.timeout_s,
                    stdout=out,
                    stderr=out,
                    user=sealed_judge,
                    mounts=mounts,
                )
        verifier_s = time.monotonic() - t0
        output = tail(scratch / "output.log", 2000)
        if result.ended != "exited":
            raise VerifierError(
                f"verifier of {task.task_id} hung: killed after timeout_s={spec.timeout_s}"
            )
        if spec.kind == "pytest":
            # 0: all passed, 1: some failed; 2-5: interrupted, internal, usage, nothing collected.
            if result.exit_code not in (0, 1):
                raise VerifierError(
                    f"pytest verifier of {task.task_id} crashed (exit {result.exit_code}): "
                    f"{output[-800:]}"
                )
            score = score_report(report, spec.num_tests, key)
        else:
            try:
                score = _score_reward_dir(scratch / "verifier")
            except VerifierError as exc:
                raise VerifierError(f"{exc} (exit {result.exit_code}): {output[-800:]}") from None
        return Score(
            passed=score.passed,
            total=score.total,
            score=score.score,
            all_passed=score.all_passed,
            failed_tests=score.failed_tests,
            verifier_s=verifier_s,
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
    """`verify` (`limits`, `user` and `mounts` passed on), blaming the workspace when the verifier
    breaks on it but not on the template.

    Agent code the tests call runs in the Python host, so exiting or hanging fails only its own
    tests; a workspace can still break the verifier through what the hidden tests do with its
    files, and that must score 0, not drop the execution from training. When `verify` raises
    `VerifierError`, the verifier is run once on the task's pristine `environment/` (cached per
    task in `template_ok`): if it works there, the workspace is at fault and the score is 0 of
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
        return Score(
            passed=0,
            total=total,
            score=0.0,
            all_passed=False,
            failed_tests=(f"verifier broke on this workspace only: {exc}"[:500],),
        )
