"""The gateway: executions the driver asks for, claimed and run by an agent loop over HTTP.

In process, on the scripted engine: a driver (`ExternalRollout.run_many`, as the RL loops call
it) publishes executions; an external loop (plain httpx for the execution API, the openai SDK for
the model) claims them, calls the model, posts rewards or asks for the verifier, and closes them.
The driver's `Executed` records carry exactly the calls the proxy logged and the posted rewards;
bad requests get their 4xx and lose nothing; deadlines, limits and unclaimed executions end as
the harness's would. The slow test runs `python -m gyre.gateway` on the real engines for one
training step.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import anyio
import httpx
import msgspec
import openai
import pytest

from gyre.config import GatewayConfig, config_from_dict, load_config
from gyre.engines.scripted import ScriptedEngine
from gyre.errors import ConfigError, ExecutionError
from gyre.model.recipe import build_tokenizer
from gyre.rollout.gateway import ExternalRollout, check_gateway
from gyre.rollout.gateway_api import ExecutionApi, serve_app
from gyre.tasks.task import Task, load_suite
from gyre.tito.log import read_log
from tests.tito.conftest import make_proxy, serving

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "examples/tasks/learnable"
TOKEN = "admin-secret"
ADMIN = {"authorization": f"Bearer {TOKEN}"}

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    return sorted(load_suite(SUITE), key=lambda t: t.task_id)[:3]


def with_limits(task: Task, **limits) -> Task:
    agent = msgspec.structs.replace(task.spec.agent, **limits)
    spec = msgspec.structs.replace(task.spec, agent=agent)
    return msgspec.structs.replace(task, spec=spec)


class Gateway:
    """A served proxy + `ExternalRollout` and an httpx client on its execution API."""

    def __init__(self, rollout: ExternalRollout, api: httpx.AsyncClient, log: Path) -> None:
        self.rollout, self.api, self.log = rollout, api, log

    async def claim(self, **body) -> httpx.Response:
        return await self.api.post("/gyre/v1/executions", json=body, headers=ADMIN)

    async def post(self, execution_id: str, what: str, body=None) -> httpx.Response:
        return await self.api.post(
            f"/gyre/v1/executions/{execution_id}/{what}", json=body, headers=ADMIN
        )


def gateway(tmp_path: Path, tok, tasks, *, max_consecutive_failures: int = 0, **config):
    """An async context: the gateway over a scripted engine, served on free ports."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def opened():
        log = tmp_path / "calls.log"
        proxy = make_proxy(tok, ScriptedEngine(vocab_size=len(tok)), log_path=str(log))
        async with serving(proxy) as base_url:
            rollout = ExternalRollout(
                proxy,
                config=GatewayConfig(enabled=True, **config),
                base_url=base_url,
                model="gyre",
                workspace_root=tmp_path / "executions",
                max_concurrent=8,
                task_ids=[t.task_id for t in tasks],
                max_consecutive_failures=max_consecutive_failures,
            )
            api = ExecutionApi(rollout, admin_token=TOKEN)
            async with anyio.create_task_group() as tg:
                port = await tg.start(partial(serve_app, api.app, host="127.0.0.1", port=0))
                # a verify runs the hidden tests: generous, so a loaded machine is no failure
                url = f"http://127.0.0.1:{port}"
                async with httpx.AsyncClient(base_url=url, timeout=120.0) as api:
                    yield Gateway(rollout, api, log)
                tg.cancel_scope.cancel()

    return opened()


async def chat_twice(claimed: dict) -> list[str]:
    """The agent: two chat calls through the proxy with the claimed key (the second extends the
    first); returns the replies."""
    client = openai.AsyncOpenAI(
        base_url=claimed["base_url"], api_key=claimed["api_key"], max_retries=0
    )
    messages = [{"role": "user", "content": claimed["task"]["instruction"]}]
    replies = []
    for _ in range(2):
        out = await client.chat.completions.create(
            model=claimed["model"], messages=messages, max_tokens=8, seed=1
        )
        replies.append(out.choices[0].message.content or "")
        messages += [
            {"role": "assistant", "content": replies[-1]},
            {"role": "user", "content": "go on"},
        ]
    await client.close()
    return replies


def solve(claimed: dict) -> None:
    """Do what a `learnable` task asks: write the word to the file, in the workspace."""
    words = claimed["task"]["instruction"].strip().removeprefix("Write the word ").rstrip(".")
    word, _, path = words.partition(" to the file ")
    (Path(claimed["task"]["workspace"]) / path).write_text(word)


async def test_external_loop_trains_like_the_harness(tmp_path, tok, tasks):
    """4 executions (2 tasks x 2): rewards posted (0.25), verified after solving (1.0), verified
    unsolved (0.0), and closed solved with no reward (the verifier runs at close: 1.0). The
    driver's records hold exactly the logged calls and those rewards."""
    jobs = [(tasks[i], f"s1-t{i}-g{j}") for i in range(2) for j in range(2)]
    plan = {
        "s1-t0-g0": "reward",
        "s1-t0-g1": "solve+verify",
        "s1-t1-g0": "verify",
        "s1-t1-g1": "solve+close",
    }
    seen: dict[str, dict] = {}
    async with gateway(tmp_path, tok, tasks) as gw:
        results = {}

        async def driver():
            results["executed"] = await gw.rollout.run_many(jobs)

        async def loop():
            for _ in jobs:
                r = await gw.claim(wait_s=10)
                assert r.status_code == 201, r.text
                claimed = r.json()
                ex_id = claimed["execution_id"]
                assert r.headers["location"] == f"/gyre/v1/executions/{ex_id}"
                seen[ex_id] = claimed
                await chat_twice(claimed)
                how = plan[ex_id]
                if "solve" in how:
                    solve(claimed)
                if how == "reward":
                    r = await gw.post(ex_id, "reward", {"reward": 0.25})
                    assert r.json() == {"execution_id": ex_id, "reward": 0.25, "passed": False}
                elif "verify" in how:
                    r = await gw.post(ex_id, "verify")
                    assert r.status_code == 200, r.text
                    want = 1.0 if "solve" in how else 0.0
                    assert (r.json()["reward"], r.json()["tests_total"]) == (want, 2)
                r = await gw.post(ex_id, "close")
                assert r.status_code == 200, r.text
                assert r.json()["model_calls"] == 2 and r.json()["termination"] == "finished"

        async with anyio.create_task_group() as tg:
            tg.start_soon(driver)
            tg.start_soon(loop)
        stats = gw.rollout.statistics()
    executed = results["executed"]
    assert [ex.outcome.execution_id for ex in executed] == [j[1] for j in jobs]  # job order
    assert sorted(seen) == sorted(j[1] for j in jobs)  # each claimed once, with its task
    for task, ex_id in jobs:
        claimed = seen[ex_id]
        assert claimed["task"]["id"] == task.task_id
        assert claimed["task"]["instruction"] == task.instruction
        assert claimed["limits"]["deadline_s"] == task.spec.agent.deadline_s
        assert claimed["anthropic_base_url"] + "/v1" == claimed["base_url"]
    assert {ex.outcome.execution_id: ex.outcome.reward for ex in executed} == {
        "s1-t0-g0": 0.25,
        "s1-t0-g1": 1.0,
        "s1-t1-g0": 0.0,
        "s1-t1-g1": 1.0,
    }
    log = read_log(gw.log)
    for ex in executed:
        assert ex.outcome.termination == "finished"
        assert ex.calls == log.for_execution(ex.outcome.execution_id)
        assert len(ex.calls) == 2 == ex.summary.num_calls == ex.outcome.model_calls
        # the second call extends the first: its prompt starts with prompt + completion
        first, second = ex.calls  # reference form: second shares all of first's tokens
        assert second.parent_call_id == first.call_id and second.divergence is None
        assert second.shared_len == first.prompt_len + len(first.completion_ids)
        assert ex.outcome.completion_tokens == sum(len(c.completion_ids) for c in ex.calls)
        assert log.summaries[ex.outcome.execution_id].num_calls == 2
    assert (stats.finished, stats.failed, stats.rewards_posted, stats.verifications) == (4, 0, 1, 2)
    assert not (tmp_path / "executions" / "s1-t0-g0").exists()  # workspaces are removed


async def test_the_anthropic_base_url_serves_the_anthropic_sdk(tmp_path, tok, tasks):
    """The claimed `anthropic_base_url` and key work with the anthropic SDK as given: two
    `messages.create` calls are the execution's two recorded calls."""
    anthropic = pytest.importorskip("anthropic")
    async with gateway(tmp_path, tok, tasks) as gw:
        async with anyio.create_task_group() as tg:
            box = {}

            async def driver():
                box["ex"] = await gw.rollout.run(tasks[0], "a1")

            tg.start_soon(driver)
            claimed = (await gw.claim(wait_s=5)).json()
            client = anthropic.AsyncAnthropic(
                base_url=claimed["anthropic_base_url"], api_key=claimed["api_key"], max_retries=0
            )
            messages = [{"role": "user", "content": claimed["task"]["instruction"]}]
            for _ in range(2):
                reply = await client.messages.create(
                    model=claimed["model"], max_tokens=8, messages=messages
                )
                text = "".join(b.text for b in reply.content if b.type == "text")
                messages += [
                    {"role": "assistant", "content": text or "ok"},
                    {"role": "user", "content": "go on"},
                ]
            await client.close()
            assert (await gw.post("a1", "reward", {"reward": 1.0})).status_code == 200
            assert (await gw.post("a1", "close")).json()["passed"] is True
    ex = box["ex"]
    assert len(ex.calls) == 2 and ex.calls == read_log(gw.log).for_execution("a1")
    assert ex.outcome.reward == 1.0 and ex.outcome.score.all_passed


async def test_bad_requests_get_4xx_and_the_run_goes_on(tmp_path, tok, tasks):
    async with gateway(tmp_path, tok, tasks) as gw:
        api = gw.api
        # nothing pending: 204 at once (and after a short wait)
        assert (await gw.claim()).status_code == 204
        assert (await gw.claim(wait_s=0.05)).status_code == 204
        async with anyio.create_task_group() as tg:
            box = {}

            async def driver():
                box["ex"] = await gw.rollout.run(tasks[0], "e1")

            tg.start_soon(driver)
            await anyio.sleep(0.05)
            listed = (await api.get("/gyre/v1/executions", headers=ADMIN)).json()
            assert listed["pending"] == [{"execution_id": "e1", "task_id": tasks[0].task_id}]

            async def refused(response: httpx.Response, status: int, code: str) -> None:
                assert response.status_code == status, response.text
                assert response.json()["error"]["code"] == code, response.text

            # authentication: no token, a wrong one
            await refused(
                await api.post("/gyre/v1/executions", json={}), 401, "invalid_admin_token"
            )
            await refused(
                await api.post("/gyre/v1/executions", headers={"authorization": "Bearer x"}),
                401,
                "invalid_admin_token",
            )
            # a pending execution cannot get a reward or be closed
            await refused(await gw.post("e1", "reward", {"reward": 1}), 409, "not_claimed")
            # malformed claims
            await refused(await gw.claim(wait_s=-1), 400, "invalid_request")
            await refused(await gw.claim(colour="blue"), 400, "invalid_request")
            await refused(await gw.claim(task_id="nope/none"), 404, "task_not_found")
            claimed = (await gw.claim(task_id=tasks[0].task_id)).json()
            assert claimed["execution_id"] == "e1"
            # the execution's key opens nothing on the execution API
            await refused(
                await api.post(
                    "/gyre/v1/executions/e1/close",
                    headers={"authorization": f"Bearer {claimed['api_key']}"},
                ),
                401,
                "invalid_admin_token",
            )
            await chat_twice(claimed)
            # unknown ids, rewards that are not finite numbers in [0, 1]
            await refused(await gw.post("e9", "reward", {"reward": 1}), 404, "execution_not_found")
            await refused(await gw.post("e9", "close"), 404, "execution_not_found")
            for body, code in (
                (b'{"reward": NaN}', "invalid_json"),
                (b'{"reward": Infinity}', "invalid_json"),
                (b"not json", "invalid_json"),
                (b'{"reward": 1e999}', "invalid_request"),
                (b'{"reward": "high"}', "invalid_request"),
                (b'{"reward": true}', "invalid_request"),
                (b"{}", "invalid_request"),
            ):
                r = await api.post("/gyre/v1/executions/e1/reward", content=body, headers=ADMIN)
                await refused(r, 400, code)
            for value in (1.5, -0.1):
                await refused(
                    await gw.post("e1", "reward", {"reward": value}), 400, "invalid_reward"
                )
            # after all that, a good reward and close
            r = await gw.post("e1", "reward", {"reward": 0.5, "passed": True})
            assert r.json() == {"execution_id": "e1", "reward": 0.5, "passed": True}
            await refused(await gw.post("e1", "reward", {"reward": 0.7}), 409, "reward_exists")
            await refused(await gw.post("e1", "verify"), 409, "reward_exists")
            r = await api.delete("/gyre/v1/executions/e1", headers=ADMIN)
            assert r.status_code == 200 and r.json()["reward"] == 0.5, r.text
            # double close, reward and verify after close
            await refused(await gw.post("e1", "close"), 409, "execution_closed")
            await refused(await gw.post("e1", "reward", {"reward": 1}), 409, "execution_closed")
            await refused(await gw.post("e1", "verify"), 409, "execution_closed")
        ex = box["ex"]
        stats = gw.rollout.statistics()
    assert ex.outcome.termination == "finished"
    assert (ex.outcome.reward, ex.outcome.score.all_passed) == (0.5, True)
    assert ex.calls == read_log(gw.log).for_execution("e1") and len(ex.calls) == 2
    # refused: 2 auth + 1 pending + 3 claims + 1 key + 2 unknown + 7 bodies + 2 ranges + 2 twice
    # + 3 after close; total: those, 2 claims answered 204, the listing, claim, reward, delete
    assert (stats.requests_refused, stats.requests_total, stats.finished) == (23, 29, 1)


async def test_deadline_closes_and_scores_what_it_left(tmp_path, tok, tasks):
    """Past the task's deadline gyre closes the execution (the key stops working) and scores the
    workspace as it stood: the file the loop wrote passes, `timeout`."""
    task = with_limits(tasks[0], deadline_s=0.5)
    async with gateway(tmp_path, tok, tasks) as gw:
        async with anyio.create_task_group() as tg:
            box = {}

            async def driver():
                box["ex"] = await gw.rollout.run(task, "late")

            tg.start_soon(driver)
            claimed = (await gw.claim(wait_s=5)).json()
            await chat_twice(claimed)
            solve(claimed)
            await anyio.sleep(0.8)
            r = await gw.post("late", "close")
            assert r.status_code == 409 and r.json()["error"]["code"] == "execution_closed"
            client = openai.AsyncOpenAI(
                base_url=claimed["base_url"], api_key=claimed["api_key"], max_retries=0
            )
            with pytest.raises(openai.AuthenticationError):
                await client.chat.completions.create(
                    model="gyre", messages=[{"role": "user", "content": "hi"}], max_tokens=2
                )
            await client.close()
    ex = box["ex"]
    assert ex.outcome.termination == "timeout"
    assert ex.outcome.reward == 1.0 and ex.outcome.score.total == 2
    assert len(ex.calls) == 2 and ex.summary.num_calls == 2


async def test_turn_limit_stops_and_unclaimed_or_silent_executions_fail(tmp_path, tok, tasks):
    """max_turns=1: gyre closes it after the first call (`turn_limit`, workspace scored: 0 of 2);
    an execution no loop claims within claim_timeout_s, and one closed before any model call
    (field case B20), end `failed` with their reasons and stay in the call log."""
    limited = with_limits(tasks[0], max_turns=1)
    async with gateway(tmp_path, tok, tasks, claim_timeout_s=0.3) as gw:
        box = {}
        async with anyio.create_task_group() as tg:

            async def driver(task, ex_id):
                box[ex_id] = await gw.rollout.run(task, ex_id)

            tg.start_soon(driver, limited, "limited")
            claimed = (await gw.claim(wait_s=5)).json()
            client = openai.AsyncOpenAI(
                base_url=claimed["base_url"], api_key=claimed["api_key"], max_retries=0
            )
            await client.chat.completions.create(
                model="gyre", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            await client.close()
            with anyio.fail_after(10):
                while "limited" not in box:
                    await anyio.sleep(0.02)
            tg.start_soon(driver, tasks[1], "silent")
            silent = (await gw.claim(wait_s=5)).json()
            r = await gw.post(silent["execution_id"], "close")
            assert r.json()["termination"] == "failed"
            tg.start_soon(driver, tasks[2], "unclaimed")
        stats = gw.rollout.statistics()
    assert box["limited"].outcome.termination == "turn_limit"
    assert box["limited"].outcome.score.passed == 0 and len(box["limited"].calls) == 1
    assert box["silent"].outcome.failure_reason == "finished before its first model call"
    assert box["unclaimed"].outcome.failure_reason == (
        "no agent loop claimed it within gateway.claim_timeout_s=0.3 s"
    )
    assert set(read_log(gw.log).summaries) == {"limited", "silent", "unclaimed"}
    assert (stats.stopped, stats.failed, stats.unclaimed, stats.pending) == (1, 2, 1, 0)


async def test_no_loop_claiming_executions_of_two_tasks_stops_the_run(tmp_path, tok, tasks):
    """`loop.max_consecutive_failures` holds for the gateway too: a run no agent loop serves
    stops at the streak, with the reason, instead of failing every execution for an hour each."""
    async with gateway(tmp_path, tok, tasks, claim_timeout_s=0.2, max_consecutive_failures=2) as gw:
        first = await gw.rollout.run(tasks[0], "a0")
        with pytest.raises(ExecutionError) as info:
            await gw.rollout.run(tasks[1], "b0")
    assert first.outcome.failed
    assert str(info.value) == (
        "2 executions of 2 tasks failed in a row (loop.max_consecutive_failures=2), the last b0 "
        f"of {tasks[1].task_id}: no agent loop claimed it within gateway.claim_timeout_s=0.2 s"
    )


async def test_a_waiting_claim_gets_the_next_published_execution(tmp_path, tok, tasks):
    async with gateway(tmp_path, tok, tasks) as gw:
        async with anyio.create_task_group() as tg:
            box = {}

            async def waiting_claim():
                box["claim"] = await gw.claim(task_id=tasks[1].task_id, wait_s=10)

            tg.start_soon(waiting_claim)
            await anyio.sleep(0.1)
            tg.start_soon(gw.rollout.run, tasks[0], "other")  # another task: not for that claim
            tg.start_soon(gw.rollout.run, tasks[1], "mine")
            with anyio.fail_after(5):
                while "claim" not in box:
                    await anyio.sleep(0.02)
            assert box["claim"].status_code == 201
            assert box["claim"].json()["execution_id"] == "mine"
            assert gw.rollout.statistics().pending == 1
            for ex_id in ("mine", "other"):
                if ex_id == "other":
                    assert (await gw.claim()).json()["execution_id"] == "other"
                assert (await gw.post(ex_id, "close")).status_code == 200


def test_gateway_config_checks(tmp_path):
    base = {"run_dir": str(tmp_path / "run")}
    with pytest.raises(ConfigError, match="max_claim_wait_s=0"):
        config_from_dict({**base, "gateway": {"max_claim_wait_s": 0}})
    refused = (
        "gateway.enabled with tasks.harness.require_isolation = true (the default): agent loops "
        "of the gateway run outside gyre's sandbox, so their isolation cannot be required; set "
        "tasks.harness.require_isolation = false"
    )
    for harness in ({}, {"require_isolation": True}):  # the default and an explicit true
        with pytest.raises(ConfigError) as exc:
            check_gateway(
                config_from_dict(
                    {**base, "gateway": {"enabled": True}, "tasks": {"harness": harness}}
                )
            )
        assert str(exc.value) == refused
    waived = {"harness": {"require_isolation": False}}
    check_gateway(config_from_dict({**base, "gateway": {"enabled": True}, "tasks": waived}))
    check_gateway(config_from_dict(base))  # gateway off: the harness's preflight decides
    assert math.isclose(GatewayConfig().claim_timeout_s, 3600.0)
    example = load_config(REPO / "examples/gateway-cpu.toml")
    assert (example.gateway.port, example.loop.heldout_tasks) == (8765, 0)
    assert example.tasks.harness.require_isolation is False
    check_gateway(msgspec.structs.replace(example, gateway=GatewayConfig(enabled=True)))
    assert [load_suite(s)[0].task_id for s in example.tasks.suites] == ["learnable/000-blue-b-txt"]


def test_gateway_preflight_and_cli_errors(tmp_path, capsys):
    """With the gateway on, the agent program is not checked (no agent is started) but
    `require_isolation` must be false: `python -m gyre.gateway` on a config that leaves it at its
    default says so in one line, exit status 2, before anything is built."""
    from gyre.gateway import main
    from gyre.job import preflight

    raw = {
        "run_dir": str(tmp_path / "run"),
        "model": {"path": str(tmp_path / "model")},
        "tasks": {
            "suites": [str(SUITE)],
            "harness": {"agent_command": ["no-such-agent"], "require_isolation": False},
        },
        "gateway": {"enabled": True},
    }
    assert preflight(config_from_dict(raw), resume=False) is None
    del raw["tasks"]["harness"]["require_isolation"]
    path = tmp_path / "run.toml"
    path.write_bytes(msgspec.toml.encode({**raw, "gateway": {}}))  # the CLI turns it on
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "gyre: error: gateway.enabled with tasks.harness.require_isolation = true (the default)"
    ) and err.endswith("; set tasks.harness.require_isolation = false\n")
    assert not (tmp_path / "model").exists() and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_gateway_cli_trains_one_step_on_real_engines(tmp_path, tiny_model_dir):
    """`python -m gyre.gateway` on the real engines (vLLM cell + DeepSpeed): this test is the
    agent loop; one step of 2 executions with posted rewards 0 and 1 trains and applies."""
    pytest.importorskip("vllm")
    pytest.importorskip("deepspeed")
    from gyre.runtime.checkpoint import ExecutionLedger
    from gyre.runtime.metrics import StepMetrics, read_metrics

    run_dir = tmp_path / "run"
    config = {
        "run_dir": str(run_dir),
        "seed": 3,
        "model": {"path": str(tiny_model_dir), "init_if_missing": False},
        "engine": {"max_model_len": 1024},
        "loop": {
            "steps": 1,
            "batch_executions": 2,
            "group_size": 2,
            "heldout_tasks": 0,
            "max_concurrent_executions": 2,
        },
        "tasks": {"suites": [str(SUITE)], "harness": {"require_isolation": False}},
        "trainer": {"learning_rate": 1e-3},
        "warm_start": {"enabled": False},
        "gateway": {"admin_token": TOKEN},
    }
    path = tmp_path / "run.toml"
    path.write_bytes(msgspec.toml.encode(config))
    with open(tmp_path / "gateway.log", "wb") as out:
        node = subprocess.Popen(
            [sys.executable, "-m", "gyre.gateway", "--config", str(path)],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 600
            while not (run_dir / "gateway.json").exists():
                assert node.poll() is None, (tmp_path / "gateway.log").read_text()[-3000:]
                assert time.monotonic() < deadline
                time.sleep(0.5)
            url = json.loads((run_dir / "gateway.json").read_text())["url"]
            rewards = {}
            with httpx.Client(base_url=url, headers=ADMIN, timeout=120) as api:
                for reward in (0.0, 1.0):
                    r = api.post("/executions", json={"wait_s": 60})
                    assert r.status_code == 201, r.text
                    claimed = r.json()
                    client = openai.OpenAI(
                        base_url=claimed["base_url"], api_key=claimed["api_key"], max_retries=0
                    )
                    client.chat.completions.create(
                        model=claimed["model"],
                        messages=[{"role": "user", "content": claimed["task"]["instruction"]}],
                        max_tokens=12,
                    )
                    ex_id = claimed["execution_id"]
                    assert api.post(f"/executions/{ex_id}/reward", json={"reward": reward})
                    assert api.post(f"/executions/{ex_id}/close").status_code == 200
                    rewards[ex_id] = reward
            assert node.wait(timeout=600) == 0, (tmp_path / "gateway.log").read_text()[-3000:]
        finally:
            if node.poll() is None:
                node.kill()
    (step,) = [r for r in read_metrics(run_dir) if isinstance(r, StepMetrics)]
    assert step.applied and step.executions == 2 and step.model_calls == 2
    entries = ExecutionLedger(run_dir).entries(1)
    assert {e.outcome.execution_id: e.outcome.reward for e in entries} == rewards
    log = read_log(run_dir / "calls.log")
    calls = [c for ex_id in rewards for c in log.for_execution(ex_id)]
    assert step.policy_tokens == sum(len(c.completion_ids) for c in calls) > 0
