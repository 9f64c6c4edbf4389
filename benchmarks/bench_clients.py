"""Real agent clients through the TITO proxy: one tree, one path, every policy token kept.

Each client runs an unmodified tool loop of `TURNS` turns (reasoning + one tool call per turn, then
a final answer; the scripted engine plays the model, so every client sees the same replies)
through the proxy, with the client's default habits: the OpenAI Agents SDK and LangChain drop
reasoning from the history they echo, LangChain re-serialises tool-call JSON, the Responses API
chains by `previous_response_id` or resends its items, the Anthropic SDK echoes content blocks
(and, as Claude Code does, counts tokens before each turn), a Codex-style client keeps no server
state (`store: false`, sealed reasoning sent back).
Per client: `calls`, `branches` (leaves of the execution's trajectory tree), `heals` (histories the
proxy healed back onto the recorded tokens), `divergences` and
`policy_tokens_kept_fraction_jmax8` (policy tokens on the 8 selected trajectories over all policy
tokens of the tree).

Then the proxy's own cost per call by API: the same 20-turn history sent as Chat Completions,
Responses and Messages bodies (raw HTTP, the scripted engine's short reply), interleaved rounds;
`proxy_ms_per_call` medians and the ratios against Chat. Goal: Responses and Messages <= 1.2x Chat.

Run: `.venv/bin/python benchmarks/bench_clients.py` -> benchmarks/results/clients.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import print_table, write_result  # noqa: E402
from gyre.config import ProxyConfig  # noqa: E402
from gyre.engines.scripted import ScriptedEngine, ScriptedReply  # noqa: E402
from gyre.model.recipe import build_tokenizer  # noqa: E402
from gyre.tito.proxy import TitoProxy  # noqa: E402
from gyre.trajectory import build_tree, select_trajectories  # noqa: E402

TURNS = 20
JMAX = 8
TIMING_ROUNDS = 15
CALLS_PER_ROUND = 4
ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {"name": "add", "description": "Add two integers.", "parameters": ADD_SCHEMA},
    }
]
TASK = "Add the pairs one by one with the tool, then say you are done."


def script(tok) -> list[ScriptedReply]:
    """`TURNS - 1` replies of reasoning + one `add` call, then a final answer (the tiny model's
    format: `<think>` and `<tool_call>`)."""
    eos = tok.eos_token_id
    replies = []
    for k in range(TURNS - 1):
        text = (
            f"<think>pair {k}: I add {k} and {k + 1}.</think>\n"
            f'<tool_call>{{"name": "add", "arguments": {{"a": {k}, "b": {k + 1}}}}}</tool_call>'
        )
        replies.append(ScriptedReply(token_ids=tok.encode(text, add_special_tokens=False) + [eos]))
    final = tok.encode("All pairs are added. Done.", add_special_tokens=False) + [eos]
    replies.append(ScriptedReply(token_ids=final))
    return replies


def add(a: int, b: int) -> str:
    return str(a + b)


# -- clients (each runs in a worker thread against base URL + key) -----------------------------


def openai_chat(base: str, key: str) -> None:
    """The openai SDK's Chat Completions with an exact echo of each reply."""
    import openai

    client = openai.OpenAI(base_url=base, api_key=key, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    for _ in range(TURNS):
        msg = client.chat.completions.create(model="gyre", messages=messages, tools=CHAT_TOOLS)
        msg = msg.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            return
        for tc in msg.tool_calls:
            args = json.loads(tc.function.arguments)
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": add(**args)})


def _agents_run(base: str, key: str, *, chat: bool) -> None:
    import agents
    import openai

    agents.set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0)
    model = (
        agents.OpenAIChatCompletionsModel(model="gyre", openai_client=client)
        if chat
        else agents.OpenAIResponsesModel(model="gyre", openai_client=client)
    )
    agent = agents.Agent(
        name="adder", instructions=TASK, model=model, tools=[agents.function_tool(add)]
    )
    agents.Runner.run_sync(agent, TASK, max_turns=TURNS + 2)


def agents_sdk_responses(base: str, key: str) -> None:
    """The OpenAI Agents SDK (Python) with its default model API: Responses."""
    _agents_run(base, key, chat=False)


def agents_sdk_chat(base: str, key: str) -> None:
    """The OpenAI Agents SDK (Python) on Chat Completions (`OpenAIChatCompletionsModel`)."""
    _agents_run(base, key, chat=True)


def _langchain_run(base: str, key: str, *, responses: bool) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    add_tool = tool(add, description="Add two integers.")
    llm = ChatOpenAI(
        model="gyre", base_url=base, api_key=key, max_retries=0, use_responses_api=responses
    ).bind_tools([add_tool])
    messages: list[Any] = [HumanMessage(TASK)]
    for _ in range(TURNS):
        ai = llm.invoke(messages)
        messages.append(ai)
        if not ai.tool_calls:
            return
        for tc in ai.tool_calls:
            messages.append(ToolMessage(content=add(**tc["args"]), tool_call_id=tc["id"]))


def langchain_chat(base: str, key: str) -> None:
    """LangChain `ChatOpenAI` (Chat Completions), tool calls echoed as LangChain re-serialises."""
    _langchain_run(base, key, responses=False)


def langchain_responses(base: str, key: str) -> None:
    """LangChain `ChatOpenAI(use_responses_api=True)`."""
    _langchain_run(base, key, responses=True)


def _anthropic_run(base: str, key: str, *, count: bool) -> None:
    """The anthropic SDK's `messages.create`, content blocks echoed as returned; with `count`,
    `messages.count_tokens` first on every turn, which must equal the turn's
    `usage.input_tokens`."""
    import anthropic

    client = anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key=key, max_retries=0)
    tools = [{"name": "add", "description": "Add two integers.", "input_schema": ADD_SCHEMA}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    for _ in range(TURNS):
        counted = (
            client.messages.count_tokens(model="gyre", tools=tools, messages=messages)
            if count
            else None
        )
        r = client.messages.create(model="gyre", max_tokens=256, tools=tools, messages=messages)
        if counted is not None and counted.input_tokens != r.usage.input_tokens:
            raise AssertionError(f"count_tokens {counted.input_tokens} != {r.usage.input_tokens}")
        messages.append({"role": "assistant", "content": [b.model_dump() for b in r.content]})
        uses = [b for b in r.content if b.type == "tool_use"]
        if not uses:
            return
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": b.id, "content": add(**b.input)}
                    for b in uses
                ],
            }
        )


def anthropic_messages(base: str, key: str) -> None:
    """The anthropic SDK's `messages.create`, content blocks echoed as returned."""
    _anthropic_run(base, key, count=False)


def openai_responses_stateless(base: str, key: str) -> None:
    """A Codex-style stateless Responses client: `store: false`, the reasoning's
    `encrypted_content` included, every turn's output items sent back as input (the reasoning
    item without its text: summary and `encrypted_content` only), no `previous_response_id`."""
    import openai

    client = openai.OpenAI(base_url=base, api_key=key, max_retries=0)
    tools = [{"type": "function", "name": "add", "description": "Add.", "parameters": ADD_SCHEMA}]
    items: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    for _ in range(TURNS):
        r = client.responses.create(
            model="gyre",
            input=items,
            tools=tools,
            store=False,
            include=["reasoning.encrypted_content"],
            reasoning={"summary": "auto"},
        )
        calls = []
        for out in r.output:
            item = out.model_dump(exclude_none=True)
            if item["type"] == "reasoning":
                item.pop("content", None)
            items.append(item)
            if item["type"] == "function_call":
                calls.append(item)
        if not calls:
            return
        for c in calls:
            output = add(**json.loads(c["arguments"]))
            items.append(
                {"type": "function_call_output", "call_id": c["call_id"], "output": output}
            )


def anthropic_messages_counting(base: str, key: str) -> None:
    """The anthropic SDK as Claude Code drives it: `messages.count_tokens` before every turn
    (to decide when to compact), which must equal the turn's own `usage.input_tokens`."""
    _anthropic_run(base, key, count=True)


CLIENTS: dict[str, Callable[[str, str], None]] = {
    "openai_chat": openai_chat,
    "agents_sdk_responses": agents_sdk_responses,
    "agents_sdk_chat": agents_sdk_chat,
    "langchain_chat": langchain_chat,
    "langchain_responses": langchain_responses,
    "anthropic_messages": anthropic_messages,
    "openai_responses_stateless": openai_responses_stateless,
    "anthropic_messages_counting": anthropic_messages_counting,
}


def new_proxy(tok, engine: ScriptedEngine) -> TitoProxy:
    return TitoProxy(
        tokenizer=tok,
        engine_for=lambda _: engine,
        config=ProxyConfig(accept_any_model=True, max_body_bytes=64 * 2**20),
    )


async def run_client(tok, name: str, fn: Callable[[str, str], None]) -> dict[str, Any]:
    engine = ScriptedEngine(
        script(tok), eos_token_id=tok.eos_token_id, max_model_len=65536, tokenizer=tok
    )  # the tokenizer: strict tools (the Agents SDK's) are enforced by a grammar
    proxy = new_proxy(tok, engine)
    key = proxy.mint_key(name)
    error = None
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.serve)
        try:
            await anyio.to_thread.run_sync(fn, f"http://127.0.0.1:{port}/v1", key)
        except Exception as exc:  # a client that fails is reported, not hidden
            error = f"{type(exc).__name__}: {exc}"[:400]
        tg.cancel_scope.cancel()
    calls = proxy.calls(name)
    stats = proxy.statistics()
    out: dict[str, Any] = {"calls": len(calls), "error": error}
    if calls:
        tree = build_tree(calls)
        kept = select_trajectories(tree, JMAX).policy_tokens
        total = int(tree.policy_N.sum())
        out |= {
            "branches": len(tree.leaves()),
            "heals": stats.heals,
            "divergences": stats.divergences,
            "policy_tokens": total,
            "policy_tokens_kept_fraction_jmax8": round(kept / total, 4) if total else None,
        }
    return out


# -- per-call cost by API at the same history -----------------------------------------------------


def histories(tok) -> dict[str, tuple[str, bytes]]:
    """(path, body) per API: the same conversation of `TURNS - 1` tool turns plus a new user
    message, as Chat Completions, Responses and Messages request bodies."""
    chat: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    items: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    anth: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    for k in range(TURNS - 1):
        args = json.dumps({"a": k, "b": k + 1})
        cid = f"call_{k}"
        reasoning = f"pair {k}: I add {k} and {k + 1}."
        chat.append(
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": reasoning,
                "tool_calls": [
                    {"id": cid, "type": "function", "function": {"name": "add", "arguments": args}}
                ],
            }
        )
        chat.append({"role": "tool", "tool_call_id": cid, "content": str(2 * k + 1)})
        items.append(
            {
                "type": "reasoning",
                "id": f"rs_{k}",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": reasoning}],
            }
        )
        items.append({"type": "function_call", "call_id": cid, "name": "add", "arguments": args})
        items.append({"type": "function_call_output", "call_id": cid, "output": str(2 * k + 1)})
        anth.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": reasoning, "signature": ""},
                    {"type": "tool_use", "id": cid, "name": "add", "input": {"a": k, "b": k + 1}},
                ],
            }
        )
        anth.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": cid, "content": str(2 * k + 1)}],
            }
        )
    tail = "And now one more pair, please."
    chat.append({"role": "user", "content": tail})
    items.append({"role": "user", "content": tail})
    anth[-1]["content"].append({"type": "text", "text": tail})
    tools_r = [{"type": "function", "name": "add", "description": "Add.", "parameters": ADD_SCHEMA}]
    tools_a = [{"name": "add", "description": "Add.", "input_schema": ADD_SCHEMA}]
    enc = json.dumps
    return {
        "chat": (
            "/chat/completions",
            enc({"model": "gyre", "max_tokens": 8, "messages": chat, "tools": CHAT_TOOLS}).encode(),
        ),
        "responses": (
            "/responses",
            enc(
                {"model": "gyre", "max_output_tokens": 8, "input": items, "tools": tools_r}
            ).encode(),
        ),
        "messages": (
            "/messages",
            enc({"model": "gyre", "max_tokens": 8, "messages": anth, "tools": tools_a}).encode(),
        ),
    }


async def time_apis(tok) -> dict[str, Any]:
    reply = tok.encode(" ok", add_special_tokens=False) + [tok.eos_token_id]
    engine = ScriptedEngine(
        rule=lambda req, i, v: ScriptedReply(token_ids=reply),
        eos_token_id=tok.eos_token_id,
        max_model_len=65536,
        tokenizer=tok,
    )
    proxy = new_proxy(tok, engine)
    bodies = histories(tok)
    samples: dict[str, list[float]] = {api: [] for api in bodies}
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.serve)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}/v1", timeout=60) as http:
            keys = {api: proxy.mint_key(f"timing-{api}") for api in bodies}
            for api, (path, body) in bodies.items():  # warm-up, and every API must answer
                r = await http.post(path, content=body, headers=_auth(keys[api]))
                if r.status_code != 200:
                    raise SystemExit(f"{api}: {r.status_code} {r.text[:300]}")
            for _ in range(TIMING_ROUNDS):
                for api, (path, body) in bodies.items():
                    t0 = time.perf_counter()
                    for _ in range(CALLS_PER_ROUND):
                        r = await http.post(path, content=body, headers=_auth(keys[api]))
                        r.raise_for_status()
                    samples[api].append((time.perf_counter() - t0) * 1000 / CALLS_PER_ROUND)
        tg.cancel_scope.cancel()
    ms = {api: round(statistics.median(s), 3) for api, s in samples.items()}
    return {
        "proxy_ms_per_call": ms,
        "responses_vs_chat_ratio": round(ms["responses"] / ms["chat"], 3),
        "messages_vs_chat_ratio": round(ms["messages"] / ms["chat"], 3),
    }


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def main() -> None:
    tok = build_tokenizer()
    clients = {}
    for name, fn in CLIENTS.items():
        clients[name] = await run_client(tok, name, fn)
        print(name, clients[name], flush=True)
    timing = await time_apis(tok)
    numbers = {"clients": clients, **timing}
    config = {
        "turns": TURNS,
        "jmax": JMAX,
        "engine": "scripted (the same replies for every client: reasoning + one tool call a turn)",
        "proxy": "history = heal (default)",
        "timing": f"{TIMING_ROUNDS} interleaved rounds x {CALLS_PER_ROUND} calls per API",
        "goals": [
            "branches == 1 and policy_tokens_kept_fraction_jmax8 == 1.0 per client",
            "responses_vs_chat_ratio <= 1.2",
            "messages_vs_chat_ratio <= 1.2",
        ],
    }
    write_result("clients", config, numbers)
    print_table("clients", [{"client": name, **c} for name, c in clients.items()])
    print(json.dumps(timing, indent=1))


if __name__ == "__main__":
    anyio.run(main, backend="trio")
