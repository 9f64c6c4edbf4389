"""Model-call records in O(total tokens): recording, reading back and the tree of one execution.

One agent conversation per size goes through the TITO proxy (chat API, in process over ASGI) on
the scripted engine: every turn adds a user message (a tool result) and gets a short reply, so each
prompt extends the previous prompt + completion. The proxy records every call in reference form
(`ModelCall.shared_len` + `prompt_tail`) into its call log; the log is then read back with
`read_log` and the tree built with `build_tree`. Sizes: 100, 200 and 400 calls of ~256 new tokens
a turn (the issue's table: 26K, 51K, 101K context tokens) and 400 calls of ~1,750 (~700K).

Per size: `record_peak_bytes` (tracemalloc peak from the first request to the end of `read_log`,
the proxy and its records still alive, so recording and reading back are both held at the peak;
the agent side's conversation JSON is in it too), `records_bytes` (the call log's size),
`tree_build_s`, and the peak over the execution's token arrays' bytes: the per-token arrays of
its trajectory tree (`token_bytes`, the denominator `bench_tree` uses) and, stricter, its int32
token IDs alone (`token_id_bytes`). Goals at 700K: `record_peak_bytes_over_token_bytes` <= 4,
`tree_build_s` <= 2.

Run: `.venv/bin/python -m benchmarks.bench_records` -> benchmarks/results/records.json
"""

from __future__ import annotations

import gc
import os
import random
import tempfile
import time
import tracemalloc
from pathlib import Path

import anyio
import httpx
import msgspec

from benchmarks.common import print_table, write_result
from gyre.config import ProxyConfig
from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from gyre.model.recipe import build_tokenizer
from gyre.tito.log import read_log
from gyre.tito.proxy import TitoProxy
from gyre.trajectory import build_tree

CONFIG = {
    "sizes": {"100": [100, 256], "200": [200, 256], "400": [400, 256], "700k": [400, 1750]},
    "reply": " the file is read",
    "seed": 0,
}
WORDS = (
    "the file line read write run test pass fail value name path src main def return import class"
).split()
ENC = msgspec.json.Encoder()


def tree_bytes(tree) -> int:
    return sum(getattr(tree, name).nbytes for name in tree.__slots__ if name.endswith("_N"))


async def one_execution(tok, calls: int, new_tokens: int, log_path: Path) -> dict:
    """Record one execution through the proxy, read it back, build its tree; the numbers."""
    rng = random.Random(CONFIG["seed"] + calls * new_tokens)
    reply_ids = tok.encode(CONFIG["reply"], add_special_tokens=False) + [tok.eos_token_id]
    engine = ScriptedEngine(
        rule=lambda req, i, v: ScriptedReply(token_ids=reply_ids),
        eos_token_id=tok.eos_token_id,
        max_model_len=4_000_000,
    )
    per_word = len(tok.encode(" file", add_special_tokens=False))
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    proxy = TitoProxy(
        tokenizer=tok, engine_for=lambda _: engine, config=ProxyConfig(), log_path=str(log_path)
    )
    key = proxy.mint_key("x")
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    parts = [ENC.encode({"role": "system", "content": "You are a coding agent."})]
    transport = httpx.ASGITransport(app=proxy.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy/v1") as http:
        for _ in range(calls):
            text = " ".join(rng.choice(WORDS) for _ in range(max(1, new_tokens // per_word)))
            parts.append(ENC.encode({"role": "user", "content": text}))
            body = b'{"model":"gyre","max_tokens":16,"messages":[' + b",".join(parts) + b"]}"
            r = await http.post("/chat/completions", content=body, headers=headers)
            r.raise_for_status()
            parts.append(ENC.encode(msgspec.json.decode(r.content)["choices"][0]["message"]))
            del body, r
    refs = proxy.calls("x")
    await proxy.close("x")
    record_s = time.perf_counter() - t0
    del parts
    t0 = time.perf_counter()
    got = read_log(log_path)
    read_s = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    assert got.calls == refs and got.unresolved == 0 and got.torn_bytes == 0
    proxy.log.close()
    del proxy, refs
    t0 = time.perf_counter()
    tree = build_tree(got.calls)
    build_s = time.perf_counter() - t0
    stats = tree.statistics()
    token_bytes = tree_bytes(tree)
    return {
        "calls": stats.calls,
        "context_tokens": stats.depth,
        "unique_tokens": stats.unique_tokens,
        "tokens_in_calls": stats.tokens_in_calls,
        "record_peak_bytes": peak,
        "records_bytes": log_path.stat().st_size,
        "token_bytes": token_bytes,
        "token_id_bytes": int(tree.token_N.nbytes),
        "record_peak_bytes_over_token_bytes": peak / token_bytes,
        "record_peak_bytes_over_token_id_bytes": peak / tree.token_N.nbytes,
        "record_s": record_s,
        "read_s": read_s,
        "tree_build_s": build_s,
    }


async def run() -> None:
    tok = build_tokenizer()
    numbers: dict[str, object] = {}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (calls, new_tokens) in CONFIG["sizes"].items():
            out = await one_execution(tok, calls, new_tokens, Path(tmp) / f"{name}.log")
            numbers[name] = out
            rows.append({"size": name, **{k: out[k] for k in list(out)[:7]}})
            rows[-1]["peak/token_bytes"] = round(out["record_peak_bytes_over_token_bytes"], 2)
            rows[-1]["tree_build_s"] = round(out["tree_build_s"], 3)
    big = numbers["700k"]
    numbers["record_peak_bytes_over_token_bytes_700k"] = big["record_peak_bytes_over_token_bytes"]
    numbers["tree_build_s_700k"] = big["tree_build_s"]
    numbers["load_average_1m"] = os.getloadavg()[0]
    numbers["goals"] = {
        "record_peak_bytes_over_token_bytes_700k": "<= 4",
        "tree_build_s_700k": "<= 2",
    }
    write_result("records", CONFIG, numbers)
    print_table("records in O(total tokens): one execution through the proxy", rows)


def main() -> None:
    anyio.run(run)


if __name__ == "__main__":
    main()
