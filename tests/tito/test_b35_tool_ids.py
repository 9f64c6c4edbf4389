"""Field case B35 (docs/field_cases.md): the tool-call IDs the proxy mints satisfy the model
format's own rule and the APIs' limits, on every route, and never split a tree.

A tiny model in Mistral's pre-v11 layout (`tests/tito/sp_families.py`: SentencePiece, the
`[TOOL_CALLS] [{...}]` format, a template that refuses an ID of other than 9 letters and digits,
as Mistral v0.3 / Mixtral / Nemo do) with vLLM's `mistral` parser; the tiny byte-level model
with gyre's own format for the OpenAI-style IDs.
"""

from __future__ import annotations

import json
import re

import pytest

from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from gyre.errors import ConfigError
from tests.tito.conftest import asgi_post, encode, make_proxy
from tests.tito.sp_families import mistral_v3_tokenizer

pytestmark = pytest.mark.anyio

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    }
]
ANTHROPIC_TOOLS = [{"name": "run", "input_schema": TOOLS[0]["function"]["parameters"]}]
RESPONSES_TOOLS = [{"type": "function", **TOOLS[0]["function"]}]

MISTRAL_TURNS = (
    '[TOOL_CALLS] [{"name": "run", "arguments": {"cmd": "ls -la"}}, '
    '{"name": "run", "arguments": {"cmd": "pwd"}}]',
    '[TOOL_CALLS] [{"name": "run", "arguments": {"cmd": "cat a.py"}}]',
    "It holds one line.",
)


def mistral_rule(tool_id: str) -> bool:
    """Mistral's rule (mistral-common's validator, the templates' check): 9 alphanumerics."""
    return re.fullmatch(r"[A-Za-z0-9]{9}", tool_id) is not None


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    return mistral_v3_tokenizer(tmp_path_factory.mktemp("mistral_v3"))


async def post(proxy, path: str, key: str, body: dict) -> dict:
    status, raw = await asgi_post(proxy, path, key, body)
    assert status == 200, raw
    return json.loads(raw)


async def chat_loop(proxy, key: str, stream: bool) -> list[list[str]]:
    """Three chat turns, each reply's tool calls echoed with a result; the IDs per turn."""
    msgs: list[dict] = [{"role": "user", "content": "List the files."}]
    seen = []
    for _ in MISTRAL_TURNS:
        body = {"model": "gyre", "messages": msgs, "tools": TOOLS, "stream": stream}
        status, raw = await asgi_post(proxy, "/v1/chat/completions", key, body)
        assert status == 200, raw
        if stream:
            lines = [x[6:] for x in raw.decode().splitlines() if x.startswith("data: {")]
            deltas = [json.loads(x)["choices"][0]["delta"] for x in lines]
            calls = [tc for d in deltas for tc in d.get("tool_calls") or ()]
            content = "".join(d.get("content") or "" for d in deltas) or None
            msg = {"role": "assistant", "content": content}
            if calls:
                msg["tool_calls"] = [{k: v for k, v in tc.items() if k != "index"} for tc in calls]
        else:
            msg = json.loads(raw)["choices"][0]["message"]
        ids = [tc["id"] for tc in msg.get("tool_calls") or ()]
        seen.append(ids)
        results = [{"role": "tool", "tool_call_id": i, "content": "a.py"} for i in ids]
        msgs += [msg, *results]
    return seen


async def messages_loop(proxy, key: str) -> list[list[str]]:
    msgs: list[dict] = [{"role": "user", "content": "List the files."}]
    seen = []
    for _ in MISTRAL_TURNS:
        body = {"model": "gyre", "max_tokens": 256, "messages": msgs, "tools": ANTHROPIC_TOOLS}
        out = await post(proxy, "/v1/messages", key, body)
        ids = [b["id"] for b in out["content"] if b["type"] == "tool_use"]
        seen.append(ids)
        results = [{"type": "tool_result", "tool_use_id": i, "content": "a.py"} for i in ids]
        msgs += [{"role": "assistant", "content": out["content"]}]
        if results:
            msgs += [{"role": "user", "content": results}]
    return seen


async def responses_loop(proxy, key: str) -> list[list[str]]:
    items: list[dict] = [{"role": "user", "content": "List the files."}]
    seen = []
    for _ in MISTRAL_TURNS:
        body = {"model": "gyre", "input": items, "tools": RESPONSES_TOOLS}
        out = await post(proxy, "/v1/responses", key, body)
        calls = [o for o in out["output"] if o["type"] == "function_call"]
        assert all(o["id"].startswith("fc") for o in calls)  # OpenAI's rule for item IDs
        seen.append([o["call_id"] for o in calls])
        items += out["output"]
        items += [
            {"type": "function_call_output", "call_id": o["call_id"], "output": "a.py"}
            for o in calls
        ]
    return seen


@pytest.mark.parametrize("route", ["chat", "chat-stream", "messages", "responses"])
async def test_b35_mistral_tool_call_ids_pass_the_template_on_the_next_turn(
    mistral, route, anyio_backend
):
    tok = mistral
    replies = [encode(tok, t) + [tok.eos_token_id] for t in MISTRAL_TURNS]
    engine = ScriptedEngine([ScriptedReply(token_ids=r) for r in replies], vocab_size=len(tok))
    proxy = make_proxy(tok, engine, tool_parser="mistral", reasoning_parser="none")
    key = proxy.mint_key("m")
    if route.startswith("chat"):
        seen = await chat_loop(proxy, key, stream=route == "chat-stream")
    elif route == "messages":
        seen = await messages_loop(proxy, key)
    else:
        seen = await responses_loop(proxy, key)
    ids = [i for turn in seen for i in turn]
    assert [len(turn) for turn in seen] == [2, 1, 0]
    assert all(mistral_rule(i) for i in ids), ids
    assert len(set(ids)) == len(ids)  # unique within the execution
    calls = proxy.calls("m", full=True)
    assert [c.completion_ids for c in calls] == replies
    for prev, call in zip(calls, calls[1:]):  # one path: each prompt extends the last
        known = prev.prompt_ids + prev.completion_ids
        assert (call.parent_call_id, call.divergence) == (prev.call_id, None)
        assert call.prompt_ids[: len(known)] == known
    # The IDs reached the model: each tool result names its call in the prompt.
    prompt = tok.decode(calls[2].prompt_ids, skip_special_tokens=False)
    assert all(f'"call_id": "{i}"' in prompt for i in ids)


async def test_b35_the_same_call_gets_the_same_ids(mistral, anyio_backend):
    """Deterministic: a second proxy running the same execution mints the same IDs."""
    tok = mistral
    out = []
    for _ in range(2):
        replies = [encode(tok, t) + [tok.eos_token_id] for t in MISTRAL_TURNS]
        engine = ScriptedEngine([ScriptedReply(token_ids=r) for r in replies], vocab_size=len(tok))
        proxy = make_proxy(tok, engine, tool_parser="mistral", reasoning_parser="none")
        out.append(await chat_loop(proxy, proxy.mint_key("m"), stream=False))
    assert out[0] == out[1]


async def test_b35_openai_style_ids_fit_every_api(tok, anyio_backend):
    """An execution ID of 200 characters with dots and colons (the harness allows them): every
    ID is at most 40 characters of [A-Za-z0-9_-] (OpenAI's limit on tool-call IDs, Anthropic's
    characters for tool_use IDs), unique within the execution."""
    reply = '<tool_call>\n{"name": "run", "arguments": {"cmd": "ls"}}\n</tool_call>'
    ids = encode(tok, reply) + [tok.eos_token_id]
    engine = ScriptedEngine([ScriptedReply(token_ids=ids)] * 3, vocab_size=len(tok))
    proxy = make_proxy(tok, engine)
    execution = "suite.long:task-7." + "x" * 182
    key = proxy.mint_key(execution)
    user = [{"role": "user", "content": "ls"}]
    chat = await post(
        proxy, "/v1/chat/completions", key, {"model": "gyre", "messages": user, "tools": TOOLS}
    )
    body = {"model": "gyre", "max_tokens": 64, "messages": user, "tools": ANTHROPIC_TOOLS}
    anthropic = await post(proxy, "/v1/messages", key, body)
    responses = await post(
        proxy, "/v1/responses", key, {"model": "gyre", "input": "ls", "tools": RESPONSES_TOOLS}
    )
    minted = [
        chat["choices"][0]["message"]["tool_calls"][0]["id"],
        next(b["id"] for b in anthropic["content"] if b["type"] == "tool_use"),
        next(o["call_id"] for o in responses["output"] if o["type"] == "function_call"),
    ]
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,40}", i) for i in minted), minted
    assert len(set(minted)) == 3


async def test_b35_a_template_that_refuses_the_minted_ids_is_refused_at_start(mistral):
    """gyre's own format mints `call_...` IDs, which a Mistral template refuses: the proxy
    says so when it starts, not with a 400 on the second turn of every tool loop."""
    with pytest.raises(ConfigError, match="tool-call IDs.*'mistral'"):
        make_proxy(mistral, ScriptedEngine(vocab_size=len(mistral)), tool_parser="gyre")
