"""End to end on the real engine: harness -> reference agent -> TITO proxy -> vLLM cell (tiny
model).

The untrained tiny model mostly fails the tasks; this checks the mechanics on one task of each
suite: every model call is recorded with its role and exact tokens, the execution ends exactly
once with a termination reason, and the verifier scores what the workspace holds.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from gyre.agents.control import ExecutionControl
from gyre.agents.harness import REACT_AGENT, Harness
from gyre.config import ProxyConfig
from gyre.tasks.task import load_suite
from tests.agents.drive import with_deadline

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"
SUITES = ["learnable", "terminal-mini", "nl2repo-mini", "multiagent-mini"]


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


def shortest(suite: str):
    """The task with the shortest instruction (the tiny model's context is 2048 tokens)."""
    return min(load_suite(EXAMPLES / suite), key=lambda t: (len(t.instruction), t.task_id))


@pytest.mark.slow
@pytest.mark.anyio
async def test_reference_agent_on_vllm(vllm_engine, tiny_model_dir, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from gyre.tito.proxy import TitoProxy

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    proxy = TitoProxy(tokenizer=tokenizer, engine_for=lambda _e: vllm_engine, config=ProxyConfig())
    command = [*REACT_AGENT, "--max-turns", "3", "--max-tokens", "48", "--temperature", "1.0"]
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.serve)
        harness = Harness(
            base_url=f"http://127.0.0.1:{port}/v1",
            agent_command=command,
            workspace_root=tmp_path / "x",
        )
        for suite in SUITES:
            task = with_deadline(shortest(suite), 120.0)
            eid = f"vllm-{suite}"
            key = proxy.mint_key(eid)

            def refresh(c: ExecutionControl, eid: str = eid) -> None:
                s = proxy.summary(eid)
                c.observe_totals(
                    model_calls=s.num_calls,
                    completion_tokens=s.completion_tokens,
                    context_refusals=s.context_refusals,
                )

            outcome = await harness.run(
                task, eid, control=ExecutionControl(refresh=refresh), api_key=key
            )
            calls = proxy.calls(eid)
            summary = await proxy.close(eid)
            assert outcome.termination in ("finished", "context_exceeded"), outcome
            assert outcome.model_calls == summary.num_calls == len(calls) >= 1
            assert {c.role for c in calls} <= {
                "main",
                "sub_agent",
                "main_summary",
                "sub_agent_summary",
            }
            assert calls[0].role == "main"
            assert all(
                len(c.completion_ids) == len(c.logprobs) == len(c.versions) >= 1 for c in calls
            )
            assert outcome.score is not None and 0 <= outcome.score.passed <= outcome.score.total
            assert outcome.completion_tokens == sum(len(c.completion_ids) for c in calls)
        tg.cancel_scope.cancel()
