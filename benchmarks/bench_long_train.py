"""One training step on one long execution's tree, on CPU: peak memory and time against its paths.

A synthetic execution of about 8K, 32K and 128K unique tokens on the tiny model (the
`gyre.model.recipe` shape: hidden 128, 2 layers, 4 heads, 2 K/V heads, vocabulary 1024, context
32768; float32, random weights): a main agent whose prompts extend the previous prompt +
completion + a tool result, compacted whenever its context passes `context_tokens` (a
`main_summary` call branches off; the next main call restarts from the system prompt + the
summary), and sub-agents with their own shared system prompt. Every path is selected (Jmax = all
leaves) and packed with `micro_batch_tokens`; a tree over it is cut into DFS chunks, each
attending to its ancestors' cached K/V (`gyre.rl.packed_forward`, attention "sdpa").

One step = `microbatch_loss` + backward per micro-batch + AdamW, each size in a fresh process.
Reports per size the process peak RSS (`ru_maxrss`, bytes), the RSS before the step, the step's
seconds and tokens per second; `train_rss_ratio_128k_over_32k` (goal <= 4.5: linear is 4) and
`tree_over_paths_time_ratio` {"32k", "128k"}: the packed tree's step over the same selected paths
trained one by one (each path its own causal sequence, plain transformers SDPA, summed
gradients, one AdamW step), both in this run, alternating `paths_repeats` times, the fastest
of each kept (goal <= 1.0; `tree_over_paths_cpu_time_ratio` the same in process CPU seconds).
`load_average_1m` is read before and after: a load over the core count means under load.

Run: `.venv/bin/python -m benchmarks.bench_long_train` (about 5 minutes on 2 cores);
`--sizes 8192` for a quick look. Other benchmarks import `run_size` and `synthetic_execution`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

from benchmarks.common import print_table, write_result

CONFIG = {
    "sizes": [8192, 32768, 131072],
    "paths_sizes": [32768, 131072],
    "paths_repeats": 3,
    "context_tokens": 8192,
    "micro_batch_tokens": 16384,
    "query_block": 512,
    "vocab": 1024,
    "system_tokens": 500,
    "summary_tokens": 300,
    "tool_tokens": (50, 250),
    "completion_tokens": (50, 150),
    "sub_agent_every": 12,
    "calls_per_sub_agent": 6,
    "dtype": "float32",
    "seed": 0,
}


def synthetic_execution(total_tokens: int, cfg: dict = CONFIG):
    """Model calls (reference form, record order) of one execution of about `total_tokens` unique
    tokens: main calls compacted at `context_tokens`, a sub-agent every `sub_agent_every` calls."""
    from gyre.tito.records import ModelCall

    rng = np.random.default_rng(cfg["seed"])

    def tokens(n):
        return rng.integers(0, cfg["vocab"], n).tolist()

    def span(lohi):
        return int(rng.integers(lohi[0], lohi[1] + 1))

    calls: list[ModelCall] = []
    length: dict[str, int] = {}
    unique = 0

    def record(call_id, role, parent, tail, completion):
        nonlocal unique
        n = len(completion)
        shared = 0 if parent is None else length[parent]
        calls.append(
            ModelCall(
                execution_id=f"long{total_tokens}",
                call_id=call_id,
                role=role,
                shared_len=shared,
                prompt_tail=tail,
                completion_ids=completion,
                logprobs=(-rng.random(n) * 3).tolist(),
                versions=[1] * n,
                finish_reason="stop",
                parent_call_id=parent,
            )
        )
        length[call_id] = shared + len(tail) + n
        unique += len(tail) + n

    system = tokens(cfg["system_tokens"])
    sub_system = tokens(cfg["system_tokens"] // 2)
    new, parent, k, epoch, subs = list(system), None, 0, 0, 0
    while unique < total_tokens:
        call_id = f"main{epoch}.{k}"
        record(call_id, "main", parent, new, tokens(span(cfg["completion_tokens"])))
        parent, k = call_id, k + 1
        new = tokens(span(cfg["tool_tokens"]))
        if length[parent] + 2 * cfg["tool_tokens"][1] > cfg["context_tokens"]:
            summary = tokens(cfg["summary_tokens"])
            record(f"summary{epoch}", "main_summary", parent, new + tokens(20), summary)
            epoch, k = epoch + 1, 0
            # the compacted context restarts from the system prompt (shared) + the summary
            new, parent = system + summary, None
        if k and k % cfg["sub_agent_every"] == 0:
            sub_new, sub_parent = sub_system + tokens(100), None
            for j in range(cfg["calls_per_sub_agent"]):
                sub_id = f"sub{subs}.{j}"
                record(sub_id, "sub_agent", sub_parent, sub_new, tokens(60))
                sub_new, sub_parent = tokens(span(cfg["tool_tokens"])), sub_id
            subs += 1
    return calls


def _model(cfg: dict):
    import torch

    from gyre.config import ModelConfig
    from gyre.model.recipe import build_model

    torch.manual_seed(cfg["seed"])
    model = build_model(ModelConfig(), cfg["vocab"])
    model.config._attn_implementation = "sdpa"
    return model.to(getattr(torch, cfg["dtype"])).train()


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_size(total_tokens: int, mode: str = "tree", cfg: dict = CONFIG) -> dict:
    """One step in this process: `mode` "tree" (packed, chunked) or "linear" (paths one by one).
    Returns seconds, tokens, peak RSS (bytes) and RSS before the step."""
    import torch

    from gyre.rl import microbatch_loss
    from gyre.trajectory import build_tree, pack_batch, select_trajectories

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    tree = build_tree(synthetic_execution(total_tokens, cfg))
    selection = select_trajectories(tree, len(tree.leaves()))
    model = _model(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    eid = tree.execution_id
    before = _rss_bytes()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    if mode == "tree":
        batches = pack_batch([(tree, selection)], token_budget=cfg["micro_batch_tokens"])
        tokens = sum(b.num_tokens for b in batches)
        for batch in batches:
            loss, _ = microbatch_loss(model, batch, {eid: 1.0}, trainer_version=1, max_staleness=0)
            loss.backward()
    else:
        tokens = 0
        weight = 1.0 / selection.policy_tokens
        for leaf in selection.leaves:
            path = tree.path(int(leaf))
            ids = torch.as_tensor(tree.token_N[path].astype(np.int64))[None]
            tokens += ids.shape[1]
            logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
            policy = torch.as_tensor(tree.policy_N[path[1:]])
            lp = torch.log_softmax(logits[policy], -1).gather(1, ids[0, 1:][policy][:, None])
            (-(lp.sum()) * weight).backward()
    optimizer.step()
    seconds = time.perf_counter() - t0
    end = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = end.ru_utime + end.ru_stime - usage.ru_utime - usage.ru_stime
    stats = tree.statistics()
    return {
        "mode": mode,
        "tree_tokens": int(stats.unique_tokens),
        "depth": int(stats.depth),
        "paths": len(selection.leaves),
        "trained_tokens": int(tokens),
        "step_s": seconds,
        "step_cpu_s": cpu_s,
        "tokens_per_s": tokens / seconds,
        "rss_before_step_bytes": before,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def _in_child(total_tokens: int, mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_long_train", "--child", str(total_tokens), mode],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="*", default=CONFIG["sizes"])
    parser.add_argument("--child", nargs=2, metavar=("TOKENS", "MODE"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_size(int(args.child[0]), args.child[1])))
        return
    rows, numbers = [], {}
    load_before = os.getloadavg()[0]
    ratios, cpu_ratios = {}, {}
    for n in args.sizes:
        tag = f"{n // 1024}k"
        side_by_side = n in CONFIG["paths_sizes"] or n == max(args.sizes)
        # tree and paths alternate `paths_repeats` times; each keeps its fastest step (the
        # least disturbed by other load on the machine)
        trees, linears = [], []
        for _ in range(CONFIG["paths_repeats"] if side_by_side else 1):
            trees.append(_in_child(n, "tree"))
            if side_by_side:
                linears.append(_in_child(n, "linear"))
        tree = min(trees, key=lambda r: r["step_s"])
        rows.append({"size": tag, **tree})
        numbers[f"train_peak_rss_bytes_{tag}"] = tree["peak_rss_bytes"]
        numbers[f"train_step_rss_bytes_{tag}"] = (
            tree["peak_rss_bytes"] - tree["rss_before_step_bytes"]
        )
        numbers[f"train_s_{tag}"] = tree["step_s"]
        numbers[f"train_tokens_per_s_{tag}"] = tree["tokens_per_s"]
        numbers[f"tree_tokens_{tag}"] = tree["tree_tokens"]
        if side_by_side:
            linear = min(linears, key=lambda r: r["step_s"])
            rows.append({"size": tag, **linear})
            numbers[f"train_s_all_{tag}"] = [r["step_s"] for r in trees]
            numbers[f"linear_s_all_{tag}"] = [r["step_s"] for r in linears]
            numbers[f"linear_s_{tag}"] = linear["step_s"]
            numbers[f"linear_tokens_{tag}"] = linear["trained_tokens"]
            numbers[f"linear_peak_rss_bytes_{tag}"] = linear["peak_rss_bytes"]
            ratios[tag] = tree["step_s"] / linear["step_s"]
            cpu_ratios[tag] = min(r["step_cpu_s"] for r in trees) / min(
                r["step_cpu_s"] for r in linears
            )
    numbers["tree_over_paths_time_ratio"] = ratios
    numbers["tree_over_paths_cpu_time_ratio"] = cpu_ratios
    if "train_peak_rss_bytes_128k" in numbers and "train_peak_rss_bytes_32k" in numbers:
        numbers["train_rss_ratio_128k_over_32k"] = (
            numbers["train_peak_rss_bytes_128k"] / numbers["train_peak_rss_bytes_32k"]
        )
        numbers["train_step_rss_ratio_128k_over_32k"] = (
            numbers["train_step_rss_bytes_128k"] / numbers["train_step_rss_bytes_32k"]
        )
    numbers["load_average_1m_before"] = load_before
    numbers["load_average_1m"] = os.getloadavg()[0]
    print_table("long-execution training step (CPU, tiny model)", rows)
    if set(args.sizes) == set(CONFIG["sizes"]):
        write_result("long_train", CONFIG, numbers)
    else:
        print(json.dumps(numbers, indent=1))


if __name__ == "__main__":
    main()
