"""Verifiers: score = passed / total from the sealed report, test.sh rewards, hangs and crashes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gyre.tasks.scorer import VerifierError, score_report, score_workspace, verify
from gyre.tasks.sealed import sign
from gyre.tasks.task import load_task
from tests.tasks.test_task import make_task

HALF_WRONG = "def double(x):\n    return 2 * x\n\ndef half(x):\n    return x\n"
MOD_TESTS = {
    "test_mod.py": (
        "def test_double():\n    from mod import double\n    assert double(2) == 4\n\n\n"
        "def test_half():\n    from mod import half\n    assert half(4) == 2\n"
    )
}


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


def workspace(tmp_path: Path, files: dict[str, str]) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    for name, text in files.items():
        (ws / name).write_text(text)
    return ws


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.mark.anyio
async def test_partial_and_full_score(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path / "t", tests=MOD_TESTS))
    ws = workspace(tmp_path, {"mod.py": HALF_WRONG})
    score = await verify(task, ws)
    assert (score.passed, score.total, score.score, score.all_passed) == (1, 2, 0.5, False)
    assert score.failed_tests == ("tests.test_mod::test_half",)
    (ws / "mod.py").write_text(HALF_WRONG.replace("return x\n", "return x // 2\n"))
    score = await verify(task, ws)
    assert (score.passed, score.total, score.score, score.all_passed) == (2, 2, 1.0, True)


@pytest.mark.anyio
async def test_uncollectable_file_counts_against_declared_total(tmp_path: Path) -> None:
    tests = {
        "test_ok.py": "def test_ok():\n    assert 1 + 1 == 2\n",
        "test_missing.py": "import missing_mod\n\n\ndef test_a():\n    pass\n\n\n"
        "def test_b():\n    pass\n",
    }
    toml = "[verifier]\nnum_tests = 3\n"
    task = load_task(make_task(tmp_path / "t", toml=toml, tests=tests))
    score = await verify(task, workspace(tmp_path, {}))
    assert (score.passed, score.total) == (1, 3)
    assert score.score == pytest.approx(1 / 3)


@pytest.mark.anyio
async def test_hanging_test_fails_alone(tmp_path: Path) -> None:
    tests = {
        "test_h.py": "def test_hang():\n    from mod import spin\n    spin()\n\n\n"
        "def test_ok():\n    pass\n"
    }
    toml = "[verifier]\nnum_tests = 2\ntest_timeout_s = 1.0\n"
    task = load_task(make_task(tmp_path / "t", toml=toml, tests=tests))
    spin = "def spin():\n    while True:\n        pass\n"
    score = await verify(task, workspace(tmp_path, {"mod.py": spin}))
    assert (score.passed, score.total) == (1, 2)


@pytest.mark.anyio
async def test_hanging_verifier_is_a_clear_error(tmp_path: Path) -> None:
    toml = "[verifier]\nkind = 'script'\ntimeout_s = 1.0\n"
    task = load_task(make_task(tmp_path / "t", toml=toml, tests={"test.sh": "sleep 300\n"}))
    with pytest.raises(VerifierError, match=r"hung: killed after timeout_s=1.0"):
        await verify(task, workspace(tmp_path, {}))


@pytest.mark.anyio
async def test_crashing_pytest_verifier_is_an_error(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path / "t", tests={"test_empty.py": "# no tests here\n"}))
    with pytest.raises(VerifierError, match=r"crashed \(exit 5\)"):
        await verify(task, workspace(tmp_path, {}))


@pytest.mark.anyio
@pytest.mark.parametrize(
    "script, expected",
    [
        ('echo 0.75 > "$GYRE_REWARD_DIR/reward.txt"\n', (0, 1, 0.75)),
        ('echo \'{"passed": 3, "total": 4}\' > "$GYRE_REWARD_DIR/reward.json"\n', (3, 4, 0.75)),
        ('echo \'{"reward": 1.0}\' > "$GYRE_REWARD_DIR/reward.json"; exit 1\n', (1, 1, 1.0)),
    ],
)
async def test_script_verifier_rewards(tmp_path: Path, script: str, expected) -> None:
    task = load_task(
        make_task(tmp_path / "t", toml="[verifier]\nkind = 'script'\n", tests={"test.sh": script})
    )
    score = await verify(task, workspace(tmp_path, {}))
    assert (score.passed, score.total, score.score) == expected


@pytest.mark.anyio
@pytest.mark.parametrize(
    "script, fragment",
    [
        ("exit 0\n", "wrote neither reward.txt nor reward.json"),
        ('echo 1.5 > "$GYRE_REWARD_DIR/reward.txt"\n', "reward=1.5, outside [0, 1]"),
        ('echo nan > "$GYRE_REWARD_DIR/reward.txt"\n', "outside [0, 1]"),
        (
            'echo \'{"passed": 5, "total": 4}\' > "$GYRE_REWARD_DIR/reward.json"\n',
            "unusable reward",
        ),
    ],
)
async def test_script_verifier_bad_reward(tmp_path: Path, script: str, fragment: str) -> None:
    task = load_task(
        make_task(tmp_path / "t", toml="[verifier]\nkind = 'script'\n", tests={"test.sh": script})
    )
    with pytest.raises(VerifierError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        await verify(task, workspace(tmp_path, {}))


@pytest.mark.anyio
async def test_verifier_works_on_a_copy_and_ignores_workspace_hooks(tmp_path: Path) -> None:
    tests = {
        "test_w.py": (
            "import os\n\n\ndef test_vandal():\n    os.remove('mod.py')\n"
            "    open('new.txt', 'w').write('x')\n\n\n"
            "def test_fails():\n    assert False\n"
        )
    }
    task = load_task(make_task(tmp_path / "t", toml="[verifier]\nnum_tests = 2\n", tests=tests))
    ws = workspace(
        tmp_path,
        {
            "mod.py": "x = 1\n",
            # an agent trying to pass every test: neither file may be picked up by the verifier
            "conftest.py": "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\n"
            "def pytest_runtest_makereport(item, call):\n"
            "    out = yield\n    out.get_result().outcome = 'passed'\n",
            "pytest.ini": "[pytest]\naddopts = -p no:junitxml\n",
        },
    )
    before = snapshot(ws)
    score = await verify(task, ws)
    assert (score.passed, score.total) == (1, 2)
    assert snapshot(ws) == before
    assert not list(task.tests_dir.glob("*.xml"))


@pytest.mark.anyio
async def test_missing_workspace(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path / "t"))
    with pytest.raises(FileNotFoundError):
        await verify(task, tmp_path / "nope")


def test_score_report_counts_failures_errors_and_skips() -> None:
    key = b"k" * 32

    def line(nodeid: str, when: str, outcome: str, sign_with: bytes = key) -> str:
        body = json.dumps({"id": f"tests/t.py::{nodeid}", "when": when, "outcome": outcome})
        return sign(sign_with, body)

    report = "\n".join(
        [
            line("a", "setup", "passed"),
            line("a", "call", "passed"),
            line("a", "teardown", "passed"),
            line("b", "setup", "passed"),
            line("b", "call", "failed"),
            line("b", "teardown", "passed"),
            line("c", "setup", "failed"),  # an error in a fixture
            line("d", "setup", "skipped"),
            line("e", "call", "passed"),
            line("e", "teardown", "failed"),  # an error in teardown
            line("f", "call", "passed"),
            sign(key, json.dumps({"id": "tests/u.py", "when": "collect", "outcome": "failed"})),
            # forged: another key, no signature, a signature of another line; all left out
            line("b", "call", "passed", b"x" * 32),
            line("g", "call", "passed", b"x" * 32),
            json.dumps({"id": "tests/t.py::h", "when": "call", "outcome": "passed"}),
            line("e", "call", "passed").rpartition(" ")[0].replace('"e"', '"i"')
            + " "
            + line("e", "call", "passed").rpartition(" ")[2],
            sign(key, json.dumps({"done": 1})),
        ]
    ).encode()
    score = score_report(report, None, key)
    assert (score.passed, score.total, score.score) == (2, 7, 2 / 7)
    assert score.failed_tests == ("tests.t::b", "tests.t::c", "tests.t::d", "tests.t::e", "tests.u")
    assert score_report(report, 10, key).total == 10
    with pytest.raises(VerifierError, match="before its closing record"):
        score_report(report.rsplit(b"\n", 1)[0], None, key)
    with pytest.raises(VerifierError, match="before its closing record"):
        score_report(report, None, b"x" * 32)  # nothing is the judge's
    with pytest.raises(VerifierError, match="no test case"):
        score_report(sign(key, '{"done": 5}').encode(), None, key)


@pytest.mark.anyio
async def test_workspace_shadowing_stdlib_does_not_break_the_verifier(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path / "t", tests=MOD_TESTS))
    ws = workspace(
        tmp_path,
        {
            "mod.py": "def double(x):\n    return 2 * x\n\ndef half(x):\n    return x // 2\n",
            "json.py": "raise SystemExit('shadowed json')\n",
            "pytest_timeout.py": "raise SystemExit('shadowed plugin')\n",
            "xml.py": "raise SystemExit('shadowed xml')\n",
        },
    )
    score = await verify(task, ws)
    assert (score.passed, score.total) == (2, 2)


@pytest.mark.anyio
async def test_workspace_code_that_exits_fails_its_tests_only(tmp_path: Path) -> None:
    """The workspace's code runs in the Python host, not in pytest: exiting on import ends its
    worker, so each test that imports it fails, and the verifier reports normally."""
    task = load_task(
        make_task(
            tmp_path / "t",
            toml="[verifier]\nnum_tests = 3\n",
            tests={**MOD_TESTS, "test_ok.py": "def test_ok():\n    pass\n"},
        )
    )
    ws = workspace(tmp_path, {"mod.py": "import os\nos._exit(3)\n"})
    score = await verify(task, ws)
    assert (score.passed, score.total, score.score) == (1, 3, 1 / 3)
    assert score.failed_tests == ("tests.test_mod::test_double", "tests.test_mod::test_half")


@pytest.mark.anyio
async def test_a_verifier_broken_by_the_workspace_scores_zero(tmp_path: Path) -> None:
    crash = "import os\nif os.path.exists('boom'):\n    os._exit(3)\n\n\ndef test_x():\n    pass\n"
    task = load_task(
        make_task(
            tmp_path / "t",
            toml="[verifier]\nnum_tests = 2\n",
            tests={**MOD_TESTS, "conftest.py": crash},
        )
    )
    ws = workspace(tmp_path, {"boom": ""})  # the hidden tests' own conftest kills pytest on it
    with pytest.raises(VerifierError, match="crashed"):
        await verify(task, ws)
    cache: dict[str, bool] = {}
    score = await score_workspace(task, ws, template_ok=cache)
    assert (score.passed, score.total, score.score) == (0, 2, 0.0)
    assert score.failed_tests[0].startswith("verifier broke on this workspace only")
    assert cache == {task.root: True}


@pytest.mark.anyio
async def test_a_verifier_broken_everywhere_is_an_error(tmp_path: Path) -> None:
    toml = "[verifier]\nkind = 'script'\n"
    task = load_task(make_task(tmp_path / "t", toml=toml, tests={"test.sh": "exit 1\n"}))
    cache: dict[str, bool] = {}
    with pytest.raises(VerifierError, match="wrote neither"):
        await score_workspace(task, workspace(tmp_path, {}), template_ok=cache)
    assert cache == {task.root: False}


@pytest.mark.anyio
async def test_a_fifo_in_the_workspace_is_left_out_of_the_copy(tmp_path: Path, monkeypatch) -> None:
    """An agent cannot fail its own execution (out of training) by leaving a FIFO or a socket to
    break the verifier's copy: they are skipped and the work is scored."""
    import os
    import socket
    import tempfile

    task = load_task(make_task(tmp_path / "t", tests=MOD_TESTS))
    ws = workspace(tmp_path, {"mod.py": HALF_WRONG})
    os.mkfifo(ws / "pipe")
    # a /tmp of this test's own: other runs on the node make and remove scratch folders meanwhile
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(ws / "sock"))
        score = await verify(task, ws)
    assert (score.passed, score.total) == (1, 2)
    assert os.listdir(tmp_path / "tmp") == []  # its scratch is gone


def test_a_verifier_python_without_pytest_is_refused_before_the_run(tmp_path: Path) -> None:
    """The fresh-clone `make run` whose environment lacked pytest failed every execution as
    "pytest wrote no report"; the preflight names the task, the interpreter and what is missing."""
    import venv

    from gyre.errors import ConfigError
    from gyre.tasks.scorer import check_verifier_python

    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)  # the same Python, none of this environment's packages
    bare_python = str(bare / "bin" / "python")
    pytest_task = load_task(make_task(tmp_path / "suite" / "t1"))
    script_task = load_task(
        make_task(
            tmp_path / "suite" / "t2",
            toml='[verifier]\nkind = "script"\n',
            tests={"test.sh": "echo 1 > $GYRE_REWARD_DIR/reward.txt\n"},
        )
    )
    check_verifier_python([script_task, pytest_task])  # this environment has both
    check_verifier_python([script_task], bare_python)  # a script verifier needs neither
    with pytest.raises(
        ConfigError,
        match=r"task .*t1 has a pytest verifier, but "
        r".*bare/bin/python cannot "
        r"import pytest, pytest_timeout",
    ):
        check_verifier_python([script_task, pytest_task], bare_python)
    missing = str(tmp_path / "no-such-python")
    with pytest.raises(
        ConfigError,
        match=r"t1 has a pytest verifier, but its interpreter .*no-such-python cannot be "
        r"started: No such file or directory",
    ):
        check_verifier_python([pytest_task], missing)  # an OSError, not a traceback
