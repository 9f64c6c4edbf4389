"""The long-tail workload agent: its draw equals an independent lognormal computation; through the
harness and the real TITO proxy (scripted engine) it makes exactly K calls, each prompt extending
the previous prompt + completion, and scores 1.0; stopped at its deadline it is scored turns
done / K."""

from __future__ import annotations

import hashlib
import json
import math
import random
from pathlib import Path

import anyio
import msgspec
import pytest

from gyre.agents.control import ExecutionControl
from gyre.agents.harness import Harness
from gyre.agents.longtail import (
    RESULT_FILE,
    LongtailSettings,
    Plan,
    draw_plan,
    longtail_command,
    plan_seed,
    run_plan,
)
from gyre.config import ProxyConfig
from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from gyre.tasks.task import load_suite

pytest.importorskip("tokenizers")
from gyre.model.recipe import build_tokenizer  # noqa: E402
from gyre.tito.proxy import TitoProxy  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


def expected_turns(execution_id: str, median: float, sigma: float, cap: int) -> int:
    """K from first principles: seed = SHA-256's first 8 bytes; K = round(median * e^(sigma z))."""
    seed = int.from_bytes(hashlib.sha256(execution_id.encode()).digest()[:8], "big")
    z = random.Random(seed).normalvariate(0.0, 1.0)
    return min(cap, max(1, round(median * math.exp(sigma * z))))


def test_draw_matches_an_independent_lognormal() -> None:
    s = LongtailSettings(
        turns_median=6.0, turns_sigma=1.2, max_turns=30, tool_median_s=3.0, tool_sigma=0.5
    )
    ks = []
    for i in range(200):
        eid = f"s1-0-t{i}-g0"
        plan = draw_plan(plan_seed(eid), s)
        assert plan.turns == expected_turns(eid, 6.0, 1.2, 30), eid
        assert len(plan.tool_s) == plan.turns and all(0 < t <= 60.0 for t in plan.tool_s)
        ks.append(plan.turns)
    assert draw_plan(plan_seed("a"), s) == draw_plan(plan_seed("a"), s)  # reproducible
    ks.sort()
    assert 4 <= ks[100] <= 8  # median near 6
    assert ks[-1] == 30 and ks[0] == 1  # sigma 1.2 over 200 draws reaches both caps
    fixed = draw_plan(5, LongtailSettings(turns_median=7.0, turns_sigma=0.0, tool_median_s=0.0))
    assert fixed == Plan(7, (0.0,) * 7)


def test_bad_settings_raise() -> None:
    with pytest.raises(ValueError, match="turns_median=0"):
        LongtailSettings(turns_median=0)
    with pytest.raises(ValueError, match="max_turns=0"):
        LongtailSettings(max_turns=0)
    with pytest.raises(ValueError, match="tool_sigma=-1"):
        LongtailSettings(tool_sigma=-1)


def proxy_and_engine():
    """The real proxy on a scripted engine whose n-th reply is the text `noted n` (+ EOS).

    Text replies, not the engine's default random IDs: random IDs need not decode to text that
    re-encodes to themselves, and the proxy then (rightly) records a divergence.
    """
    tok = build_tokenizer()

    def rule(request, index: int, vocab_size: int) -> ScriptedReply:
        return ScriptedReply(
            token_ids=tok.encode(f"noted {len(engine.requests_seen)}", add_special_tokens=False)
        )

    engine = ScriptedEngine(
        rule=rule, eos_token_id=tok.eos_token_id, max_model_len=65536, vocab_size=len(tok)
    )
    return TitoProxy(tokenizer=tok, engine_for=lambda _e: engine, config=ProxyConfig()), engine


async def run_longtail(tmp_path: Path, task, eid: str, settings: LongtailSettings):
    proxy, _ = proxy_and_engine()
    key = proxy.mint_key(eid)

    def refresh(c: ExecutionControl) -> None:
        s = proxy.summary(eid)
        c.observe_totals(
            model_calls=s.num_calls,
            completion_tokens=s.completion_tokens,
            context_refusals=s.context_refusals,
        )

    control = ExecutionControl(
        refresh=refresh,
        max_turns=task.spec.agent.max_turns,
        token_budget=task.spec.agent.token_budget,
    )
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.serve)
        harness = Harness(
            base_url=f"http://127.0.0.1:{port}/v1", workspace_root=tmp_path / "x", kill_grace_s=0.5
        )
        outcome = await harness.run(
            task, eid, control=control, api_key=key, agent_command=list(longtail_command(settings))
        )
        tg.cancel_scope.cancel()
    return outcome, proxy.calls(eid, full=True)


@pytest.mark.anyio
async def test_agent_makes_k_calls_through_the_proxy_and_scores_one(tmp_path: Path) -> None:
    task = load_suite(EXAMPLES / "longtail")[3]
    settings = LongtailSettings(
        turns_median=5.0,
        turns_sigma=0.8,
        max_turns=12,
        tool_median_s=0.05,
        tool_sigma=0.3,
        max_tokens=8,
    )
    eid = "s1-0-t3-g1"
    k = expected_turns(eid, 5.0, 0.8, 12)
    assert k >= 3  # this execution's draw (computed above) is a multi-turn one
    outcome, calls = await run_longtail(tmp_path, task, eid, settings)
    assert outcome.termination == "finished", outcome
    assert outcome.score.score == 1.0 and (outcome.score.passed, outcome.score.total) == (k, k)
    assert len(calls) == k and outcome.model_calls == k
    for prev, call in zip(
        calls, calls[1:]
    ):  # the history only grows: TITO extends, never re-tokenizes
        head = prev.prompt_ids + prev.completion_ids
        assert call.prompt_ids[: len(head)] == head and len(call.prompt_ids) > len(head)
        assert call.parent_call_id == prev.call_id and call.divergence is None
    assert all(c.finish_reason == "stop" and 0 < len(c.completion_ids) <= 8 for c in calls)


@pytest.mark.slow
@pytest.mark.anyio
async def test_stopped_at_the_deadline_scores_turns_done(tmp_path: Path) -> None:
    task = load_suite(EXAMPLES / "longtail")[0]
    agent = msgspec.structs.replace(task.spec.agent, deadline_s=8.0)
    task = msgspec.structs.replace(task, spec=msgspec.structs.replace(task.spec, agent=agent))
    settings = LongtailSettings(
        turns_median=40.0, turns_sigma=0.0, max_turns=40, tool_median_s=1.0, tool_sigma=0.0
    )
    outcome, calls = await run_longtail(tmp_path, task, "s1-0-t0-g0", settings)
    assert outcome.termination == "timeout", outcome
    assert outcome.score.total == 40 and 1 <= outcome.score.passed < 40
    # killed in a tool call (after its model call, before rewriting result.json) or between turns
    assert outcome.score.passed in (len(calls) - 1, len(calls))
    assert outcome.score.score == outcome.score.passed / 40


class _Message:
    def __init__(self, content: str) -> None:
        self.content, self.tool_calls = content, None


class _Client:
    """The slice of `openai.OpenAI` that `run_plan` uses, recording each request's messages."""

    def __init__(self) -> None:
        self.requests: list[list[dict]] = []
        self.chat = self
        self.completions = self

    def create(self, *, model, messages, max_tokens, temperature):
        self.requests.append(json.loads(json.dumps(messages)))
        choice = type("Choice", (), {"message": _Message(f"reply {len(self.requests)}")})
        return type("Response", (), {"choices": [choice]})


def test_run_plan_grows_the_history_and_writes_progress(tmp_path: Path) -> None:
    slept, seen = [], []
    client = _Client()

    def sleep(s: float) -> None:
        slept.append(s)
        seen.append(json.loads((tmp_path / RESULT_FILE).read_text()))

    plan = Plan(3, (0.5, 1.5, 2.0))
    assert run_plan(client, "do it", tmp_path, LongtailSettings(), plan, sleep=sleep) == 3
    assert slept == [0.5, 1.5, 2.0]
    assert [r["turns_done"] for r in seen] == [0, 1, 2]  # progress is on disk before each tool call
    assert json.loads((tmp_path / RESULT_FILE).read_text()) == {
        "turns_planned": 3,
        "turns_done": 3,
        "finished": True,
    }
    assert [len(m) for m in client.requests] == [2, 4, 6]
    last = client.requests[-1]
    assert last[1] == {"role": "user", "content": "do it"}
    assert last[2] == {"role": "assistant", "content": "reply 1"}
    assert last[3]["role"] == "user" and "step 1 of 3 done after 0.50 s" in last[3]["content"]
