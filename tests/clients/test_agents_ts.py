"""Slow tier: the OpenAI Agents SDK for TypeScript (`@openai/agents` from npm, installed into a
temporary folder) with its default settings (the Responses model) runs a short tool-using task
through the proxy. Skipped, with the reason, where node or npm is absent."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import anyio
import pytest

from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from tests.tito.conftest import encode, make_proxy, serving

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
if shutil.which("node") is None or shutil.which("npm") is None:
    pytestmark.append(pytest.mark.skip(reason="node and npm are needed for @openai/agents"))

AGENT_JS = """
import { Agent, run, tool, setDefaultOpenAIClient, setTracingDisabled } from '@openai/agents';
import OpenAI from 'openai';
import { z } from 'zod';
setDefaultOpenAIClient(new OpenAI({ baseURL: process.env.BASE, apiKey: process.env.KEY }));
setTracingDisabled(true);
const add = tool({
  name: 'add', description: 'Add two integers.',
  parameters: z.object({ a: z.number(), b: z.number() }),
  execute: async ({ a, b }) => String(a + b),
});
const agent = new Agent({ name: 'adder', instructions: 'Use the tool.', tools: [add] });
const result = await run(agent, 'What is 2+3?');
console.log(JSON.stringify({ final: result.finalOutput }));
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def agents_js(tmp_path_factory) -> str:
    """A folder with `@openai/agents`, `openai` and `zod` installed and the agent script."""
    root = tmp_path_factory.mktemp("agents_ts")
    (root / "package.json").write_text('{"type": "module", "private": true}')
    (root / "agent.mjs").write_text(AGENT_JS)
    done = subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", "@openai/agents", "openai", "zod"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        pytest.skip(f"npm install failed (no registry?): {done.stderr[-500:]}")
    return str(root)


async def test_agents_ts_default_settings_tool_run(tok, anyio_backend, agents_js):
    eos = tok.eos_token_id
    texts = [
        '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
        "The sum is 5.",
    ]
    ids = [encode(tok, t) + [eos] for t in texts]
    engine = ScriptedEngine(  # the tokenizer: the SDK's strict tools are a grammar to enforce
        [ScriptedReply(token_ids=i) for i in ids], eos_token_id=eos, tokenizer=tok
    )
    proxy = make_proxy(tok, engine, accept_any_model=True)
    key = proxy.mint_key("ts")
    async with serving(proxy) as base:
        done = await anyio.run_process(
            ["node", "agent.mjs"],
            cwd=agents_js,
            env={"PATH": os.environ["PATH"], "BASE": base, "KEY": key},
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert json.loads(done.stdout.decode().strip().splitlines()[-1]) == {"final": "The sum is 5."}
    calls = proxy.calls("ts", full=True)
    assert [c.completion_ids for c in calls] == ids
    assert calls[1].divergence is None
    known = calls[0].prompt_ids + calls[0].completion_ids
    assert calls[1].prompt_ids[: len(known)] == known
