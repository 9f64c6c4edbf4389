"""Per-call cost of the TITO proxy as the history grows: 1K, 100K and 700K tokens.

Each size gets its own execution whose history (many ~2K-token messages) is built once, then calls
that each add one new message are timed end to end over HTTP, in interleaved rounds (client ->
Hypercorn -> proxy -> scripted engine). The scripted engine alone is timed on prompts of the same
length in the same run, and its median is subtracted: what is left is the proxy's own cost (HTTP,
JSON, rendering, tokenizing, recording). The proxy should cost what the *new* tokens cost, not the
history.

Run: `.venv/bin/python benchmarks/bench_proxy.py` -> benchmarks/results/proxy.json
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

import anyio
import httpx
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import print_table, summarize, write_result  # noqa: E402
from gyre.config import ProxyConfig  # noqa: E402
from gyre.engines.protocol import GenerateRequest, SamplingParams, collect  # noqa: E402
from gyre.engines.scripted import ScriptedEngine, ScriptedReply  # noqa: E402
from gyre.model.recipe import build_tokenizer  # noqa: E402
from gyre.tito.proxy import TitoProxy  # noqa: E402
from gyre.tito.records import ExecutionTokens  # noqa: E402

SIZES = {"1k": 1_000, "100k": 100_000, "700k": 700_000}
ROUNDS = 25
CALLS_PER_ROUND = {"1k": 12, "100k": 2, "700k": 1}
WORDS = (
    "the file line read write run test pass fail value name path src main def return import class"
).split()
ENC = msgspec.json.Encoder()


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


class Conversation:
    """The agent side: messages as JSON pieces, so building each body costs a join, not a
    re-encode."""

    def __init__(self, tok, history_tokens: int, seed: int) -> None:
        rng = random.Random(seed)
        self.rng = rng
        self.parts = [ENC.encode({"role": "system", "content": "You are a coding agent."})]
        total = 0
        while total < history_tokens:
            n = min(1800, max(1, history_tokens - total))
            self.parts.append(ENC.encode({"role": "user", "content": words(rng, n)}))
            total += len(tok.encode(words(random.Random(0), 1), add_special_tokens=False)) * n + 5
        self.key = ""

    def body(self) -> bytes:
        return b'{"model": "gyre", "max_tokens": 16, "messages": [' + b",".join(self.parts) + b"]}"

    def extend(self, reply: dict) -> None:
        self.parts.append(ENC.encode(reply["choices"][0]["message"]))
        self.parts.append(ENC.encode({"role": "user", "content": words(self.rng, 40)}))


async def main() -> None:
    tok = build_tokenizer()
    reply_ids = tok.encode(" the file is read", add_special_tokens=False) + [tok.eos_token_id]
    engine = ScriptedEngine(
        rule=lambda req, i, v: ScriptedReply(token_ids=reply_ids),
        eos_token_id=tok.eos_token_id,
        max_model_len=2_000_000,
    )
    proxy = TitoProxy(
        tokenizer=tok,
        engine_for=lambda _: engine,
        config=ProxyConfig(),
        log_path="/tmp/gyre_bench_proxy.log",
    )
    numbers: dict[str, object] = {}
    rows = []
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.serve)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}/v1", timeout=600) as http:
            convs, headers = {}, {}
            for name, size in SIZES.items():
                convs[name] = Conversation(tok, size, seed=size)
                headers[name] = {
                    "Authorization": f"Bearer {proxy.mint_key(name)}",
                    "Content-Type": "application/json",
                }
                # Untimed: the first call renders everything, the second is cross-checked in full.
                for _ in range(2):
                    r = await http.post(
                        "/chat/completions", content=convs[name].body(), headers=headers[name]
                    )
                    r.raise_for_status()
                    convs[name].extend(r.json())
            # Timed in interleaved rounds, so load from other processes hits every size alike.
            total: dict[str, list[float]] = {name: [] for name in SIZES}
            engine_s: dict[str, list[float]] = {name: [] for name in SIZES}
            for rnd in range(ROUNDS):
                for name in SIZES:
                    if proxy.calls(name)[-1].prompt_len > 1.25 * SIZES[name] + 2000:
                        # Keep the history at its size: start the execution over (untimed).
                        await proxy.close(name)
                        convs[name] = Conversation(tok, SIZES[name], seed=SIZES[name] + rnd)
                        headers[name] = {
                            "Authorization": f"Bearer {proxy.mint_key(name)}",
                            "Content-Type": "application/json",
                        }
                        for _ in range(2):
                            r = await http.post(
                                "/chat/completions",
                                content=convs[name].body(),
                                headers=headers[name],
                            )
                            r.raise_for_status()
                            convs[name].extend(r.json())
                    fast_before = proxy.statistics().rendered_fast
                    for _ in range(CALLS_PER_ROUND[name]):
                        conv = convs[name]
                        body = conv.body()
                        t0 = time.perf_counter()
                        r = await http.post(
                            "/chat/completions", content=body, headers=headers[name]
                        )
                        raw = r.content
                        total[name].append(time.perf_counter() - t0)
                        r.raise_for_status()
                        conv.extend(msgspec.json.decode(raw))
                    # The engine alone on a prompt of the same length (its own per-token
                    # validation).
                    refs = proxy.calls(name)
                    prompt = ExecutionTokens(refs).prompt_ids(refs[-1].call_id)
                    req = GenerateRequest(
                        request_id=f"bench-{name}-{rnd}",
                        prompt_ids=prompt,
                        sampling=SamplingParams(max_tokens=16, stop_token_ids=(tok.eos_token_id,)),
                    )
                    # the fake engine's test log would pin every prompt
                    engine.requests_seen.clear()
                    fast = proxy.statistics().rendered_fast - fast_before
                    assert fast == CALLS_PER_ROUND[name], (
                        f"{name}: {fast} calls took the incremental path"
                    )
                    t0 = time.perf_counter()
                    await collect(engine, req)
                    engine_s[name].append(time.perf_counter() - t0)
            for name in SIZES:
                prompt_len = proxy.calls(name)[-1].prompt_len
                await proxy.close(name)
                ms_total = statistics.median(total[name]) * 1e3
                ms_engine = statistics.median(engine_s[name]) * 1e3
                ms = ms_total - ms_engine
                numbers[f"ms_per_call_{name}"] = ms
                numbers[f"total_ms_{name}"] = summarize([t * 1e3 for t in total[name]])
                numbers[f"engine_ms_{name}"] = summarize([t * 1e3 for t in engine_s[name]])
                numbers[f"prompt_tokens_{name}"] = prompt_len
                rows.append(
                    {
                        "history": name,
                        "prompt_tokens": prompt_len,
                        "total_ms": ms_total,
                        "engine_ms": ms_engine,
                        "proxy_ms": ms,
                    }
                )
        tg.cancel_scope.cancel()
    proxy.log.close()
    numbers["calls_per_s_1k"] = 1e3 / numbers["ms_per_call_1k"]
    numbers["ratio_700k_over_100k"] = numbers["ms_per_call_700k"] / numbers["ms_per_call_100k"]
    numbers["goal_ratio_met"] = numbers["ratio_700k_over_100k"] <= 3
    numbers["goal_rate_met"] = numbers["calls_per_s_1k"] >= 300
    config = {
        "backend": "asyncio",
        "transport": "HTTP over loopback (httpx -> Hypercorn)",
        "rounds": ROUNDS,
        "calls_per_round": CALLS_PER_ROUND,
        "new_message_tokens": 40,
        "reply_tokens": len(reply_ids),
        "goals": ["ms_per_call_700k <= 3 * ms_per_call_100k", "calls_per_s_1k >= 300"],
    }
    path = write_result("proxy", config, numbers)
    print_table("TITO proxy per-call cost (median; engine alone subtracted)", rows)
    print(
        f"calls_per_s_1k={numbers['calls_per_s_1k']:.0f}  "
        f"ratio_700k/100k={numbers['ratio_700k_over_100k']:.2f}  -> {path}"
    )


if __name__ == "__main__":
    anyio.run(main, backend="asyncio")
