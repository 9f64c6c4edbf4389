"""`gyre.run`'s preflight: every mistake a user can make in paths and the run folder is one
`ConfigError` naming the key or path, raised before anything is built or started (no model
folder written, no warm start, no engine); a resumed run that already finished starts nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec
import pytest

from gyre.config import config_from_dict
from gyre.errors import ConfigError, RunDirError
from gyre.job import run
from gyre.runtime.checkpoint import LoopState, save_checkpoint
from gyre.runtime.metrics import EvalMetrics, MetricsWriter, read_metrics


def make_config(tmp_path: Path, **sections):
    raw = {
        "run_dir": str(tmp_path / "run"),
        "model": {"path": str(tmp_path / "model")},
        "loop": {"steps": 2, "heldout_tasks": 8},
        **sections,
    }
    return config_from_dict(raw)


def nothing_built(tmp_path: Path) -> bool:
    return not (tmp_path / "model").exists() and not (tmp_path / "model-sft").exists()


def test_model_path_that_is_a_file(tmp_path):
    (tmp_path / "weights.bin").write_text("not a model")
    config = make_config(tmp_path, model={"path": str(tmp_path / "weights.bin")})
    with pytest.raises(ConfigError, match=r"model.path='.*weights.bin' is a file"):
        run(config)
    assert not (tmp_path / "weights.bin-sft").exists()


def test_model_path_that_holds_someone_elses_files(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="is a folder with files but no config.json"):
        run(make_config(tmp_path))
    assert [p.name for p in (tmp_path / "model").iterdir()] == ["notes.txt"]


def test_warm_start_path_that_holds_someone_elses_files(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    config = make_config(tmp_path, warm_start={"enabled": True, "path": str(tmp_path / "mine")})
    with pytest.raises(
        ConfigError,
        match=r"warm_start.path: '.*mine' exists, is not empty and holds no gyre_sft.json",
    ):
        run(config)
    assert nothing_built(tmp_path)


def test_default_warm_start_path_that_is_a_file(tmp_path):
    (tmp_path / "model-sft").write_text("x")
    with pytest.raises(
        ConfigError, match=r"warm_start.path \(default: model.path \+ '-sft'\): .* is not a folder"
    ):
        run(make_config(tmp_path, warm_start={"enabled": True}))
    assert not (tmp_path / "model").exists()


def test_run_dir_that_holds_a_run_or_is_a_file(tmp_path):
    MetricsWriter(tmp_path / "run").write(
        EvalMetrics(
            step=0,
            version=0,
            split="heldout",
            executions=4,
            pass_rate=0.5,
            mean_reward=0.5,
            eval_s=1.0,
        )
    )
    with pytest.raises(
        ConfigError,
        match=r"holds a run: pass --resume \(in Python: run\(config, resume=True\)\) to "
        "continue it, remove it",
    ):
        run(make_config(tmp_path))
    with pytest.raises(ConfigError, match="already holds a run: pass --resume"):
        run(make_config(tmp_path, cells={"num_cells": 2}))  # one runtime for every cell count
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="run_dir='.*file' is not a folder"):
        run(make_config(tmp_path, run_dir=str(tmp_path / "file")), resume=True)
    assert nothing_built(tmp_path)


@pytest.mark.parametrize(
    ("program", "message"),
    [
        ("no-such-agent-xyz", r"agent_command\[0\]='no-such-agent-xyz' is not found on PATH"),
        (
            "/nonexistent/agent",
            r"agent_command\[0\]='/nonexistent/agent' is not an executable file",
        ),
    ],
)
def test_agent_program_that_cannot_start(tmp_path, program, message):
    with pytest.raises(ConfigError, match=message):
        run(make_config(tmp_path, tasks={"harness": {"agent_command": [program, "--flag"]}}))
    assert nothing_built(tmp_path)


def test_agent_programs_that_can_start_pass(tmp_path):
    """`python` is the node's interpreter; a relative path is the workspace's business."""
    from gyre.agents.harness import check_agent_command

    for command in (
        [],
        ["python", "-m", "x"],
        [sys.executable],
        ["./agent.sh"],
        ["sh", "-c", "true"],
    ):
        check_agent_command(command)
    with pytest.raises(ConfigError):
        check_agent_command(["sh"], path=str(tmp_path))  # nothing on this PATH


def test_resuming_a_finished_run_starts_nothing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    done = LoopState(step=2, version=2, task_cursor=48)
    save_checkpoint(run_dir, done, lambda folder: folder.mkdir(), keep=1)
    MetricsWriter(run_dir).write(
        EvalMetrics(
            step=2,
            version=2,
            split="heldout",
            executions=4,
            pass_rate=0.75,
            mean_reward=0.8,
            eval_s=1.0,
        )
    )
    assert run(make_config(tmp_path), resume=True) == done
    assert "nothing to do" in capsys.readouterr().out
    assert nothing_built(tmp_path)
    # Without held-out tasks there is no final evaluation to wait for.
    (run_dir / "metrics.jsonl").unlink()
    assert run(make_config(tmp_path, loop={"steps": 2, "heldout_tasks": 0}), resume=True) == done


def test_a_corrupt_metrics_line_names_file_and_line(tmp_path):
    writer = MetricsWriter(tmp_path)
    writer.write(
        EvalMetrics(
            step=0,
            version=0,
            split="heldout",
            executions=4,
            pass_rate=0.5,
            mean_reward=0.5,
            eval_s=1.0,
        )
    )
    with open(writer.path, "ab") as f:
        f.write(b'{"type": "eval", "step": "two"}\n')
    writer.write(
        EvalMetrics(
            step=1,
            version=1,
            split="heldout",
            executions=4,
            pass_rate=1.0,
            mean_reward=1.0,
            eval_s=1.0,
        )
    )
    with pytest.raises(RunDirError, match=r"metrics.jsonl:2: not a metrics record"):
        read_metrics(tmp_path)
    with open(writer.path, "ab") as f:
        f.write(b'{"type": "ev')  # a torn last line is a kill mid-write, not corruption
    writer.path.write_bytes(
        writer.path.read_bytes().replace(b'{"type": "eval", "step": "two"}\n', b"")
    )
    assert [r.step for r in read_metrics(tmp_path)] == [0, 1]


OPT_OUT = "; set tasks.harness.require_isolation = false to run agents unisolated"


def test_a_node_that_is_not_root_refuses_unless_isolation_is_waived(tmp_path, monkeypatch, caplog):
    """`require_isolation` is true by default: a node that is not root refuses the run in its
    preflight, with one error naming the key and the opt-out; `require_isolation = false` passes
    the preflight, and the harness warns and runs agents as the node's user."""
    import logging
    import os

    from gyre.agents.harness import Harness
    from gyre.job import preflight

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ConfigError) as refused:
        run(make_config(tmp_path))
    assert str(refused.value) == (
        "tasks.harness.require_isolation: the node runs as uid 1000, not root, so agents cannot "
        "run as their own uids in a mount namespace of their own" + OPT_OUT
    )
    assert nothing_built(tmp_path) and not (tmp_path / "run").exists()
    waived = make_config(tmp_path, tasks={"harness": {"require_isolation": False}})
    assert preflight(waived, resume=False) is None
    with caplog.at_level(logging.WARNING, logger="gyre.agents.isolation"):
        harness = Harness.from_config(
            waived.tasks.harness, base_url="http://127.0.0.1:9/v1", run_dir=tmp_path / "run"
        )
    assert not harness.isolated and harness.mounts is None
    assert "isolate_uid: the node runs as uid 1000, not root: agents run as this user" in (
        caplog.text
    )


def test_an_agent_only_root_can_run_is_refused_unless_isolation_is_waived(tmp_path):
    """As root, under `require_isolation`: an `agent_command` whose executable agent uids cannot
    reach (a 0700 script) would run as root, so the preflight refuses the run before anything is
    built, naming the keys and the path; waived, the preflight passes (the harness warns)."""
    import os

    from gyre.job import preflight
    from gyre.sandbox import mount_namespace_problem, network_namespace_problem

    if os.geteuid() != 0 or mount_namespace_problem() or network_namespace_problem():
        pytest.skip("needs root with mount and network namespaces (else refused earlier)")
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o700)
    harness = {"agent_command": [str(script)]}
    with pytest.raises(ConfigError) as refused:
        run(make_config(tmp_path, tasks={"harness": harness}))
    assert str(refused.value) == (
        "tasks.harness.require_isolation: tasks.harness.agent_command: its executable "
        f"{script} cannot be reached by other users ({script} has mode 700), so its agent would "
        "run as root; make it reachable (e.g. a venv outside /root) or show it with "
        "tasks.harness.visible_paths" + OPT_OUT
    )
    assert nothing_built(tmp_path) and not (tmp_path / "run").exists()
    waived = make_config(tmp_path, tasks={"harness": {**harness, "require_isolation": False}})
    assert preflight(waived, resume=False) is None


# Run as an unprivileged user (in a user namespace): a harness under `require_isolation = false`
# runs one execution whose agent writes its answer and prints its uid; the verifier scores it.
WAIVED_RUN = """
import functools, json, logging, sys
from pathlib import Path
import anyio
from gyre.agents.control import ExecutionControl
from gyre.agents.harness import Harness
from gyre.config import config_from_dict
from gyre.job import preflight
from gyre.tasks.task import load_task
from tests.tasks.test_task import make_task

tmp, warnings = Path(sys.argv[1]), []
handler = logging.Handler()
handler.emit = lambda record: warnings.append(record.getMessage())
logging.getLogger("gyre").addHandler(handler)
config = config_from_dict({"run_dir": str(tmp / "run"), "model": {"path": str(tmp / "model")},
                           "tasks": {"harness": {"require_isolation": False}}})
assert preflight(config, resume=False) is None
harness = Harness.from_config(config.tasks.harness, base_url="http://127.0.0.1:9/v1",
                              run_dir=tmp / "run")
tests = {"test_out.py": "def test_out():\\n    assert open('out.txt').read() == 'mine'\\n"}
task = load_task(make_task(tmp / "suite" / "t", toml="", tests=tests))
control = ExecutionControl(refresh=lambda c: c.observe_totals(model_calls=1, completion_tokens=1))
agent = [sys.executable, "-c", "import os; open('out.txt', 'w').write('mine'); print(os.geteuid())"]
outcome = anyio.run(functools.partial(harness.run, task, "e", control=control, agent_command=agent))
stats = harness.statistics()
print(json.dumps({"termination": outcome.termination, "score": outcome.score.score,
                  "agent_uid": int(outcome.stdout_tail), "isolated": stats.isolated,
                  "sealed": stats.sealed, "warnings": warnings}))
"""


def test_an_unprivileged_user_namespace_is_refused_unless_waived(tmp_path):
    """The real path, not a patched uid: in a user namespace that maps only uid 1000 (as
    `unshare --user` gives any user; it can seal the network but gives agents no uid of their
    own), `python -m gyre.node` refuses the default config before anything is built, and with
    `require_isolation = false` an execution runs as uid 1000 with the warning."""
    import shutil
    import subprocess

    userns = ["unshare", "--user", "--map-user=1000", "--map-group=1000", "--"]
    if shutil.which("unshare") is None or subprocess.run([*userns, "true"]).returncode != 0:
        pytest.skip("no unprivileged user namespace here")
    done, ran = refused_then_waived(userns, tmp_path)
    assert (done.returncode, done.stderr.splitlines()[-1]) == (
        2,
        "gyre: error: tasks.harness.require_isolation: the node runs as uid 1000, not root, so "
        "agents cannot run as their own uids in a mount namespace of their own" + OPT_OUT,
    )
    # the network seal, where nested user namespaces are allowed (here), comes from one of the
    # agent's own that maps uid 1000 alone; else a second warning says it is missing
    warnings, sealed = ran.pop("warnings"), ran.pop("sealed")
    assert warnings[0] == (
        "isolate_uid: the node runs as uid 1000, not root: agents run as this user and can read "
        "other workspaces and hidden tests"
    )
    assert len(warnings) == 1 + (sealed == 0) and sealed in (0, 1)
    assert ran == {"termination": "finished", "score": 1.0, "agent_uid": 1000, "isolated": 0}


def refused_then_waived(prefix: list[str], tmp_path: Path):  # noqa: ANN201
    """Under the wrapper `prefix`: `python -m gyre.node` on a default config (it must build
    nothing), then `WAIVED_RUN`: (the node's CompletedProcess, the waived run's JSON)."""
    import json
    import os
    import subprocess

    repo = Path(__file__).parent.parent
    env = {**os.environ, "PYTHONPATH": str(repo)}
    path = tmp_path / "run.toml"
    path.write_text(f'run_dir = "{tmp_path / "run"}"\n[model]\npath = "{tmp_path / "model"}"\n')
    node = [sys.executable, "-m", "gyre.node", "--config", str(path)]
    refused = subprocess.run(
        [*prefix, *node], capture_output=True, text=True, env=env, cwd=repo, timeout=120
    )
    assert nothing_built(tmp_path) and not (tmp_path / "run").exists()
    script = [sys.executable, "-c", WAIVED_RUN, str(tmp_path / "waived")]
    waived = subprocess.run(
        [*prefix, *script], capture_output=True, text=True, env=env, cwd=repo, timeout=120
    )
    assert waived.returncode == 0, waived.stderr
    return refused, json.loads(waived.stdout)


ROOT_WITHOUT_UIDS = {
    # root of a user namespace that maps uid 0 alone (a rootless container looks the same)
    "userns-root": (
        ["unshare", "--user", "--map-root-user", "--"],
        "uid 200000 is not mapped in the node's user namespace (/proc/self/uid_map: 0 0 1)",
    ),
    # root whose container dropped CAP_SETUID and CAP_SETGID
    "no-setuid": (
        ["setpriv", "--bounding-set=-setuid,-setgid", "--inh-caps=-setuid,-setgid", "--"],
        "cannot run a command as uid 200000: Operation not permitted",
    ),
}


@pytest.mark.parametrize("wrapper", sorted(ROOT_WITHOUT_UIDS))
def test_root_that_cannot_switch_to_agent_uids_is_refused_unless_waived(tmp_path, wrapper):
    """An euid of 0 is not enough: root of a user namespace that does not map the agent uids, or
    root without CAP_SETUID, passed the preflight, started its cells and failed every execution
    ("cannot pick an agent uid", "Operation not permitted"). `python -m gyre.node` now refuses
    before anything is built, naming the keys; waived, the harness warns and an execution runs
    as the node's user (uid 0) and is scored, instead of failing."""
    import os
    import shutil
    import subprocess

    prefix, why = ROOT_WITHOUT_UIDS[wrapper]
    if os.geteuid() != 0 or shutil.which(prefix[0]) is None:
        pytest.skip("needs root and util-linux")
    if subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip(f"{prefix[0]} cannot make that node here")
    done, ran = refused_then_waived(prefix, tmp_path)
    assert (done.returncode, done.stderr.splitlines()[-1]) == (
        2,
        "gyre: error: tasks.harness.require_isolation: the node cannot run agents as uids "
        "200000-204095 (tasks.harness.agent_uid_base, agent_uid_count) and their verifiers' "
        f"judge as uid 65534: {why}" + OPT_OUT,
    )
    assert ran.pop("warnings")[0] == (
        "isolate_uid: agents run as the node's user: the node cannot run agents as uids "
        "200000-204095 (tasks.harness.agent_uid_base, agent_uid_count) and their verifiers' "
        f"judge as uid 65534: {why}"
    )
    ran.pop("sealed")
    assert ran == {"termination": "finished", "score": 1.0, "agent_uid": 0, "isolated": 0}


def test_a_run_killed_in_its_first_evaluation_is_a_run(tmp_path):
    """Only the call log exists then (no metrics, no ledger, no checkpoint)."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "calls.log").write_bytes(b"")
    with pytest.raises(ConfigError, match="already holds a run: pass --resume"):
        run(make_config(tmp_path))
    (tmp_path / "run" / "calls.log").unlink()
    (tmp_path / "run" / "executions.jsonl").write_bytes(b"")
    with pytest.raises(ConfigError, match="already holds a run: pass --resume"):
        run(make_config(tmp_path))
    assert nothing_built(tmp_path)


def test_a_live_page_that_cannot_listen_is_refused_before_anything(tmp_path):
    """A host that does not resolve, or a port another process holds, is one `ConfigError`
    naming `[observe]` before the model is built (it was a traceback after the warm start)."""
    import socket

    with pytest.raises(ConfigError, match=r"observe.host='not a host!' / observe.port=0"):
        run(make_config(tmp_path, observe={"page": True, "host": "not a host!"}))
    assert nothing_built(tmp_path)
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    busy = holder.getsockname()[1]
    try:
        with pytest.raises(ConfigError, match=rf"observe.port={busy}: .*(in use|Address)"):
            run(make_config(tmp_path, observe={"page": True, "port": busy}))
    finally:
        holder.close()
    assert nothing_built(tmp_path)


def test_report_cli_flags_only_for_serve_and_one_line_errors(tmp_path, capsys):
    """`--config`/`--host`/`--port` without `--serve` are refused (they were silently ignored);
    with `--serve` a bad address or a missing config is one `error:` line and exit 2."""
    from gyre.report.__main__ import main

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("")
    with pytest.raises(SystemExit) as exit_:
        main([str(run_dir), "--config", "x.toml"])
    assert exit_.value.code == 2
    assert "--config is only used with --serve" in capsys.readouterr().err
    assert main([str(run_dir), "--serve", "--host", "not a host!"]) == 2
    assert "--host='not a host!' / --port=0: the page cannot listen" in capsys.readouterr().err
    assert main([str(run_dir), "--serve", "--config", str(tmp_path / "nope.toml")]) == 2
    assert "cannot read config" in capsys.readouterr().err


def test_a_missing_model_path_is_one_error_naming_the_key_and_builds_nothing(tmp_path):
    """A mistyped path to one's own model is an error, never a tiny model built there."""
    message = (
        r"model.path='.*/model' does not exist: point it at a Hugging Face model folder, or set "
        r"\[model\] init_if_missing = true to build the built-in tiny model there$"
    )
    with pytest.raises(ConfigError, match=message):
        run(make_config(tmp_path))
    assert nothing_built(tmp_path)
    (tmp_path / "model").mkdir()
    with pytest.raises(ConfigError, match=r"model.path='.*/model' is an empty folder: point"):
        run(make_config(tmp_path))
    assert list((tmp_path / "model").iterdir()) == []


def test_warm_start_is_on_for_the_tiny_model_only_unless_set(tmp_path, tiny_model_dir):
    from gyre.job import warm_start_enabled

    own = tmp_path / "own"
    own.mkdir()
    (own / "config.json").write_text('{"model_type": "llama"}')
    other = tmp_path / "other"  # a marker, but not the tiny recipe's
    other.mkdir()
    (other / "config.json").write_text("{}")
    (other / "gyre_model.json").write_text('{"recipe": "someone-else"}')

    def enabled(path: Path, **model) -> dict:
        return {
            setting: warm_start_enabled(
                make_config(
                    tmp_path,
                    model={"path": str(path), **model},
                    warm_start={} if setting is None else {"enabled": setting},
                )
            )
            for setting in (None, True, False)
        }

    # the recipe's own folder (init_model_dir's gyre_model.json) is the tiny model
    assert enabled(tiny_model_dir) == {None: True, True: True, False: False}
    # one's own model: off by default, an explicit true is honoured
    assert enabled(own) == {None: False, True: True, False: False}
    assert enabled(other) == {None: False, True: True, False: False}
    # a missing folder is the tiny model when init_if_missing builds it, else nothing
    missing = tmp_path / "missing"
    assert enabled(missing, init_if_missing=True) == {None: True, True: True, False: False}
    assert enabled(missing) == {None: False, True: True, False: False}


def test_own_model_skips_the_warm_start_checks_unless_asked(tmp_path):
    """preflight checks the warm-start folder only when the warm start runs: with one's own
    model and the default setting a file at `<model.path>-sft` is no error."""
    from gyre.job import preflight

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "model-sft").write_text("x")
    assert preflight(make_config(tmp_path), resume=False) is None
    with pytest.raises(ConfigError, match=r"warm_start.path \(default: model.path \+ '-sft'\)"):
        preflight(make_config(tmp_path, warm_start={"enabled": True}), resume=False)


@pytest.mark.parametrize(
    ("proxy", "message"),
    [
        ({"tool_parser": "nope"}, r"tool_parser='nope' is not one of: .*hermes"),
        ({"reasoning_parser": "nope"}, r"reasoning_parser='nope' is not one of: .*qwen3"),
        ({"tool_parser": "none"}, r"tool_parser='none' is not a parser"),
    ],
)
def test_unknown_parser_names_fail_before_anything_is_built(tmp_path, proxy, message):
    """They were found only when the proxy started, after the model, the engine and the trainer
    (4.5 minutes on a loaded CPU machine)."""
    with pytest.raises(ConfigError, match=message):
        run(make_config(tmp_path, proxy=proxy))
    assert nothing_built(tmp_path) and not (tmp_path / "run").exists()


def test_a_resume_with_a_changed_penalty_is_refused_before_anything_is_built(tmp_path):
    """The run in `run_dir` recorded its settings at its start (`launches.jsonl`) and trained a
    step (a checkpoint); `--resume` with another `rl.stop_penalty` stops in the preflight, naming
    the key and both values. Before its first checkpoint a run trained nothing: any config may
    resume it."""
    from gyre.job import preflight
    from gyre.rollout.tasks import split_tasks
    from gyre.runtime.elastic_resume import LAUNCHES_FILE, Launch, launch_settings

    started = make_config(tmp_path, rl={"stop_penalty": 0.5})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    settings = launch_settings(started, *split_tasks(started))
    launch = Launch(launch="0a", resumed_from_step=None, version=0, settings=settings)
    (run_dir / LAUNCHES_FILE).write_bytes(msgspec.json.encode(launch) + b"\n")
    changed = make_config(tmp_path, rl={"stop_penalty": 0.25})
    assert preflight(changed, resume=True) is None  # nothing trained yet: no checkpoint
    state = LoopState(step=1, version=1, task_cursor=2, dispatched=16)
    save_checkpoint(run_dir, state, lambda folder: folder.mkdir(), keep=1)
    assert preflight(started, resume=True)[0] == state  # the run's own config resumes it
    with pytest.raises(ConfigError, match=r"rl\.stop_penalty = 0\.25 \(the run: 0\.5\)\. Resume"):
        run(changed, resume=True)
    assert nothing_built(tmp_path)


def test_a_config_built_in_python_with_a_wrong_type_is_refused_naming_the_key(tmp_path):
    """msgspec checks types only when decoding: `RLConfig(stop_penalty=True)` was accepted and
    trained with a penalty of 1. `run()` now checks a built config as a TOML file is checked."""
    from gyre.config import RLConfig

    config = make_config(tmp_path)
    wrong = msgspec.structs.replace(config, rl=RLConfig(stop_penalty=True))
    message = r"Expected `float`, got `bool` - at `\$\.rl\.stop_penalty`"
    with pytest.raises(ConfigError, match=message):
        run(wrong)
    a_path = msgspec.structs.replace(config, run_dir=tmp_path / "run")
    with pytest.raises(ConfigError, match="type PosixPath is unsupported"):
        run(a_path)
    assert nothing_built(tmp_path) and not (tmp_path / "run").exists()


def test_run_refuses_a_path_or_a_dict_for_its_config_and_a_resume_that_is_no_bool(tmp_path):
    """Found by a new user: `run("examples/cpu.toml")` failed with msgspec's "Expected
    'object', got 'str'", `run({...})` with an AttributeError, and `resume="yes"` was taken as
    True."""
    for wrong, kind in (("examples/cpu.toml", "str"), ({"seed": 0}, "dict")):
        with pytest.raises(ConfigError, match=rf"a RunConfig is needed, not {kind} \(gyre"):
            run(wrong)
    with pytest.raises(TypeError, match=r"resume='yes' must be True or False"):
        run(make_config(tmp_path), resume="yes")
    assert nothing_built(tmp_path)


def test_known_parser_names_pass_the_preflight(tmp_path):
    from gyre.job import preflight

    config = make_config(tmp_path, proxy={"tool_parser": "hermes", "reasoning_parser": "qwen3"})
    assert preflight(config, resume=False) is None


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"cells": {"num_cells": 0}}, r"num_cells=0 must be > 0 - at `\$.cells.num_cells`"),
        ({"cells": {"num_cells": -2}}, r"num_cells=-2 must be > 0 - at `\$.cells.num_cells`"),
        ({"scheduler": {"policy": "fifo"}}, r"'fifo' - at `\$.scheduler.policy`"),
        (
            {"scheduler": {"capacity_per_cell": 0}},
            r"capacity_per_cell=0 must be > 0 - at `\$.scheduler.capacity_per_cell`",
        ),
    ],
)
def test_bad_cells_policy_or_capacity_is_one_error_naming_the_key(tmp_path, sections, message):
    with pytest.raises(ConfigError, match=message):
        make_config(tmp_path, **sections)


def test_the_policy_is_resolved_for_the_cell_count_before_anything(tmp_path):
    sched = make_config(tmp_path).scheduler
    assert sched.policy == "auto"
    assert [sched.policy_for(n) for n in (1, 2, 4)] == ["colocate", "elastic", "elastic"]
    with pytest.raises(ConfigError, match="scheduler.async_train_cells=1 .* leaves no rollout"):
        run(make_config(tmp_path, scheduler={"policy": "async"}))  # one cell: nothing rolls out
    assert nothing_built(tmp_path)
    two = make_config(tmp_path, scheduler={"policy": "async"}, cells={"num_cells": 2}).scheduler
    assert two.policy_for(2) == "async"


def test_each_policy_gets_its_own_staleness_bound_from_the_config(tmp_path):
    from gyre.runtime.elastic_job import scheduler_policy

    config = make_config(
        tmp_path, scheduler={"max_staleness_steps": 3, "colocate_max_staleness_steps": 2}
    )
    one, two = scheduler_policy(config, 1), scheduler_policy(config, 2)
    assert (one.name, one.max_staleness_steps) == ("colocate", 2)  # partial rollouts
    assert (two.name, two.max_staleness_steps) == ("elastic", 3)
    default = scheduler_policy(make_config(tmp_path), 1)
    assert (default.name, default.max_staleness_steps) == ("colocate", 0)  # verl, on-policy
    with pytest.raises(ConfigError, match=r"colocate_max_staleness_steps=-1 must be >= 0"):
        make_config(tmp_path, scheduler={"colocate_max_staleness_steps": -1})


def test_a_suite_with_no_task_that_fits_the_context_stops_before_anything(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    from gyre.rollout.tasks import split_tasks

    sections = {
        "model": {"path": str(tiny_model_dir), "init_if_missing": False},
        "warm_start": {"enabled": False},
    }
    config = make_config(tmp_path, **sections)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    train, _ = split_tasks(config)
    shortest = min(len(tok(t.instruction)["input_ids"]) for t in train)
    too_small = make_config(tmp_path, engine={"max_model_len": shortest}, **sections)
    with pytest.raises(
        ConfigError,
        match=rf"engine.max_model_len={shortest}: no training task .* is {shortest} tokens",
    ):
        run(too_small)
    assert not (tmp_path / "run" / "cells").exists()  # no cell was started
    from gyre.job import check_context_fit

    check_context_fit(
        make_config(tmp_path, engine={"max_model_len": shortest + 1}, **sections), tiny_model_dir
    )  # one token more: the shortest fits


def test_a_missing_suite_folder_is_named_by_its_setting_before_anything_is_built(tmp_path):
    """The error named only the folder; a user with several suites had to guess which line."""
    from gyre.errors import TaskError

    good = "examples/tasks/learnable-long"
    config = make_config(tmp_path, tasks={"suites": [good, str(tmp_path / "nope")]})
    with pytest.raises(TaskError, match=r"^tasks\.suites\[1\] = '.*nope': .*nope: suite folder"):
        run(config)
    assert nothing_built(tmp_path)
