"""Build a trajectory tree for one synthetic ultra-long execution: time and peak memory.

The execution has ~700K unique tokens over 1,000 model calls: a main agent whose every prompt
extends the previous prompt + completion + a tool result, compacted 5 times (a `main_summary`
call summarises the context; the next main call restarts from the system prompt + the summary,
a branch), and 10 sub-agents with their own (shared) system prompt and chains of calls.
The records are in reference form (a call holds its parent's shared token count and its own new
tokens, as the proxy records them), so the build reads each token once, not every prompt whole.
Reports `build_s` (median wall seconds of `build_tree`) and `peak_bytes_over_token_bytes`
(tracemalloc peak during the build, numpy buffers included, over the bytes of the finished tree's
per-token arrays). Goals: build_s <= 2, peak_bytes_over_token_bytes <= 4. build_s tracks CPU
load: the 1-minute load average is recorded with the numbers.

Run: `.venv/bin/python -m benchmarks.bench_tree` (about a minute on 2 cores).
"""

from __future__ import annotations

import gc
import os
import time
import tracemalloc

import numpy as np

from benchmarks.common import print_table, summarize, write_result
from gyre.tito.records import ModelCall
from gyre.trajectory import build_tree

CONFIG = {
    "vocab": 150_000,
    "main_calls": 605,
    "compactions": 5,
    "sub_agents": 10,
    "calls_per_sub_agent": 39,
    "system_tokens": 2_000,
    "task_tokens": 1_000,
    "main_tool_tokens": (100, 900),
    "main_completion_tokens": (100, 400),
    "summary_tokens": 1_000,
    "sub_system_tokens": 1_000,
    "sub_tool_tokens": (100, 700),
    "sub_completion_tokens": (50, 350),
    "repeats": 3,
    "seed": 0,
}


def synthetic_execution(cfg: dict = CONFIG) -> list[ModelCall]:
    """The calls of one synthetic execution (see the module docstring), in record order, in
    reference form (each call holds only its new tokens, as the proxy records it)."""
    rng = np.random.default_rng(cfg["seed"])

    def tokens(n):
        return rng.integers(0, cfg["vocab"], n).tolist()

    def span(lohi):
        return int(rng.integers(lohi[0], lohi[1] + 1))

    calls: list[ModelCall] = []
    length: dict[str, int] = {}  # prompt + completion length per call

    def record(call_id, role, parent, tail, completion):
        n = len(completion)
        shared = 0 if parent is None else length[parent]
        calls.append(
            ModelCall(
                execution_id="bench",
                call_id=call_id,
                role=role,
                shared_len=shared,
                prompt_tail=tail,
                completion_ids=completion,
                logprobs=(-rng.random(n)).tolist(),
                versions=[1] * n,
                finish_reason="stop",
                parent_call_id=parent,
            )
        )
        length[call_id] = shared + len(tail) + n

    head = tokens(cfg["system_tokens"]) + tokens(cfg["task_tokens"])
    epochs = cfg["compactions"] + 1
    base, extra = divmod(cfg["main_calls"], epochs)
    per_epoch = [base + (1 if e < extra else 0) for e in range(epochs)]
    summary: list[int] = []
    parent = None
    for epoch, n_calls in enumerate(per_epoch):
        new = head + summary + (tokens(50) if summary else [])  # a new context after compaction
        for k in range(n_calls):
            completion = tokens(span(cfg["main_completion_tokens"]))
            call_id = f"main{epoch}.{k}"
            record(call_id, "main", parent if k else None, new, completion)
            new = tokens(span(cfg["main_tool_tokens"]))
            parent = call_id
        if epoch < cfg["compactions"]:
            summary = tokens(cfg["summary_tokens"])
            record(f"summary{epoch}", "main_summary", parent, new + tokens(30), summary)
    sub_head = tokens(cfg["sub_system_tokens"])
    for s in range(cfg["sub_agents"]):
        new = sub_head + tokens(200)
        parent = None
        for k in range(cfg["calls_per_sub_agent"]):
            completion = tokens(span(cfg["sub_completion_tokens"]))
            call_id = f"sub{s}.{k}"
            record(call_id, "sub_agent", parent, new, completion)
            new = tokens(span(cfg["sub_tool_tokens"]))
            parent = call_id
    return calls


def tree_bytes(tree) -> int:
    return sum(getattr(tree, name).nbytes for name in tree.__slots__ if name.endswith("_N"))


def main() -> None:
    t0 = time.perf_counter()
    calls = synthetic_execution()
    gen_s = time.perf_counter() - t0
    times = []
    for _ in range(CONFIG["repeats"]):
        gc.collect()
        t0 = time.perf_counter()
        tree = build_tree(calls)
        times.append(time.perf_counter() - t0)
        del tree
    gc.collect()
    tracemalloc.start()
    tree = build_tree(calls)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    stats = tree.statistics()
    token_bytes = tree_bytes(tree)
    numbers = {
        "build_s": summarize(times)["median"],
        "build_s_samples": summarize(times),
        "peak_bytes": peak,
        "token_bytes": token_bytes,
        "peak_bytes_over_token_bytes": peak / token_bytes,
        "peak_bytes_over_token_id_bytes": peak / tree.token_N.nbytes,
        "calls": stats.calls,
        "unique_tokens": stats.unique_tokens,
        "tokens_in_calls": stats.tokens_in_calls,
        "policy_tokens": stats.policy_tokens,
        "branches": stats.branches,
        "depth": stats.depth,
        "generate_records_s": gen_s,
        "load_average_1m": os.getloadavg()[0],
        "goals": {"build_s": "<= 2", "peak_bytes_over_token_bytes": "<= 4"},
    }
    write_result("tree", CONFIG, numbers)
    print_table(
        "trajectory tree build (one synthetic execution)",
        [
            {
                "calls": stats.calls,
                "unique_tokens": stats.unique_tokens,
                "tokens_in_calls": stats.tokens_in_calls,
                "branches": stats.branches,
                "build_s": numbers["build_s"],
                "peak/token_bytes": numbers["peak_bytes_over_token_bytes"],
            }
        ],
    )


if __name__ == "__main__":
    main()
