"""Prefix-deduplicated training: one packed tree vs linearised trajectories vs per-call rows.

Synthetic execution: a main chain of 4 calls builds a shared prefix of p = 0.9 of a path of L
tokens; k branch calls each add the remaining (1 - p) L tokens (a tool result + a completion).
On the k = 5 tree it measures the tokens a forward+backward processes (`token_ratio_vs_linear`:
k linearised rows of L tokens over the packed tree, analytic k / (p + k (1 - p)) = 3.57;
`token_ratio_vs_per_call`: every call as its own row over the packed tree) and the wall time of
forward + backward + the PPO loss with the tiny reference model (`time_ratio_vs_linear`). On a
k = 10 tree it times Jmax = 1, 5 and all (`jmax1_fraction`, `jmax5_fraction`: fractions of
all). Both paths use the same fused selective logprob and loss; linear rows run as one
[k, L] batch with plain causal attention. Runs are interleaved round-robin and ratios use the
fastest run of each (the one least disturbed by other load on a shared machine), on 1 thread.
Dense-mask attention is O(T^2), so time fractions fall below token fractions. Goals:
token_ratio_vs_linear >= 3.5, time_ratio_vs_linear >= 1.5.

Run: `.venv/bin/python -m benchmarks.bench_dedup` (about a minute on 2 cores).
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from benchmarks.common import print_table, summarize, write_result
from gyre.kernels import selective_logprob_entropy
from gyre.rl import microbatch_loss, policy_loss
from gyre.tito.records import FullCall
from gyre.trajectory import build_tree, pack_batch, select_trajectories

CONFIG = {
    "path_tokens": 1000,
    "shared_fraction": 0.9,
    "paths": 5,
    "paths_for_jmax": 10,
    "chain_calls": 4,
    "completion_fraction": 0.5,
    "model": {
        "vocab_size": 1024,
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "dtype": "float32",
    },
    "repeats": 7,
    "torch_threads": 1,
    "seed": 0,
}


def synthetic_calls(paths: int, cfg: dict = CONFIG) -> list[FullCall]:
    rng = np.random.default_rng(cfg["seed"])
    vocab = cfg["model"]["vocab_size"]
    length = cfg["path_tokens"]
    shared = int(round(cfg["shared_fraction"] * length))
    calls: list[FullCall] = []

    def call(call_id, prompt, completion, parent):
        n = len(completion)
        calls.append(
            FullCall(
                execution_id="bench",
                call_id=call_id,
                role="main",
                prompt_ids=prompt,
                completion_ids=completion,
                logprobs=(-rng.random(n) * 5).tolist(),
                versions=[1] * n,
                finish_reason="stop",
                parent_call_id=parent,
            )
        )

    step = shared // cfg["chain_calls"]
    context = rng.integers(0, vocab, step // 2).tolist()
    parent = None
    for k in range(cfg["chain_calls"]):  # each call: half tool/prompt tokens, half completion
        target = step * (k + 1)
        completion = rng.integers(0, vocab, target - len(context)).tolist()
        call(f"chain{k}", list(context), completion, parent)
        parent = f"chain{k}"
        context = context + completion
        if k < cfg["chain_calls"] - 1:
            context = context + rng.integers(0, vocab, step // 2).tolist()
    tail = length - len(context)
    for b in range(paths):
        tool = rng.integers(0, vocab, tail // 2).tolist()
        completion = rng.integers(0, vocab, tail - len(tool)).tolist()
        call(f"branch{b}", context + tool, completion, parent)
    return calls


def tiny_model() -> Qwen2ForCausalLM:
    m = dict(CONFIG["model"])
    m.pop("dtype")
    torch.manual_seed(CONFIG["seed"])
    config = Qwen2Config(**m, attn_implementation="sdpa", max_position_embeddings=4096)
    return Qwen2ForCausalLM(config).float()


def tree_step(model, batch) -> None:
    model.zero_grad(set_to_none=True)
    loss, _ = microbatch_loss(model, batch, {"bench": 1.0}, trainer_version=1, max_staleness=1)
    loss.backward()


def linear_rows(tree, selection):
    """Each selected trajectory as its own row: ids [k, L], loss mask [k, L], weights, logprobs."""
    ids, policy, blp = [], [], []
    for leaf in selection.leaves:
        path = tree.path(int(leaf))
        ids.append(tree.token_N[path])
        policy.append(tree.policy_N[path])
        blp.append(tree.logprob_N[path])
    ids, policy, blp = np.stack(ids), np.stack(policy), np.stack(blp)
    weight = np.where(policy, 1.0 / policy.sum(), 0.0)  # plain token mean over all rows
    return (
        torch.as_tensor(ids).long(),
        torch.as_tensor(policy),
        torch.as_tensor(weight),
        torch.as_tensor(np.nan_to_num(blp)),
    )


def linear_step(model, rows) -> None:
    ids, policy, weight, blp = rows
    model.zero_grad(set_to_none=True)
    hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state  # causal
    target = policy.clone()
    target[:, 0] = False
    rows_idx, cols = torch.nonzero(target, as_tuple=True)
    lp, _ = selective_logprob_entropy(
        hidden[rows_idx, cols - 1], model.lm_head.weight, ids[rows_idx, cols]
    )
    n = lp.shape[0]
    loss, _ = policy_loss(
        lp,
        blp[rows_idx, cols].float(),
        torch.ones(n),
        weight[rows_idx, cols].float(),
        torch.ones(n, dtype=torch.bool),
    )
    loss.backward()


def interleaved(fns: dict, repeats: int) -> dict[str, list[float]]:
    """Wall seconds of each fn, run round-robin (one warm-up each) so load drift hits all alike."""
    for fn in fns.values():
        fn()
    out: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            out[k].append(time.perf_counter() - t0)
    return out


def main() -> None:
    torch.set_num_threads(CONFIG["torch_threads"])
    torch.manual_seed(0)
    model = tiny_model()
    repeats = CONFIG["repeats"]
    calls = synthetic_calls(CONFIG["paths"])
    tree = build_tree(calls)
    selection = select_trajectories(tree, CONFIG["paths"])
    (batch,) = pack_batch([(tree, selection)], token_budget=1 << 20)
    rows = linear_rows(tree, selection)
    linear_tokens = int(rows[0].numel())
    per_call_tokens = sum(len(c.prompt_ids) + len(c.completion_ids) for c in calls)
    timed = interleaved(
        {"tree": lambda: tree_step(model, batch), "linear": lambda: linear_step(model, rows)},
        repeats,
    )
    tree_times, linear_times = timed["tree"], timed["linear"]

    jtree = build_tree(synthetic_calls(CONFIG["paths_for_jmax"]))
    jbatches, jtokens = {}, {}
    for label, jmax in (("1", 1), ("5", 5), ("all", CONFIG["paths_for_jmax"])):
        item = (jtree, select_trajectories(jtree, jmax))
        (jbatches[label],) = pack_batch([item], token_budget=1 << 20)
        jtokens[label] = jbatches[label].num_tokens
    jtimes = interleaved(
        {k: (lambda b=b: tree_step(model, b)) for k, b in jbatches.items()}, repeats
    )

    med = {k: min(v) for k, v in jtimes.items()}  # min: least disturbed by other load
    k, p = CONFIG["paths"], CONFIG["shared_fraction"]
    numbers = {
        "tree_tokens": batch.num_tokens,
        "linear_tokens": linear_tokens,
        "per_call_tokens": per_call_tokens,
        "token_ratio_vs_linear": linear_tokens / batch.num_tokens,
        "token_ratio_vs_linear_analytic": k / (p + k * (1 - p)),
        "token_ratio_vs_per_call": per_call_tokens / batch.num_tokens,
        "tree_step_s": summarize(tree_times),
        "linear_step_s": summarize(linear_times),
        "time_ratio_vs_linear": min(linear_times) / min(tree_times),
        "jmax_tokens": jtokens,
        "jmax_step_s": {k: summarize(v) for k, v in jtimes.items()},
        "jmax1_fraction": med["1"] / med["all"],
        "jmax5_fraction": med["5"] / med["all"],
        "jmax1_token_fraction": jtokens["1"] / jtokens["all"],
        "jmax5_token_fraction": jtokens["5"] / jtokens["all"],
        "goals": {"token_ratio_vs_linear": ">= 3.5", "time_ratio_vs_linear": ">= 1.5"},
        "load_average_1m": os.getloadavg()[0],
    }
    write_result("dedup", CONFIG, numbers)
    print_table(
        "packed tree vs linearised trajectories vs per-call rows (k = 5, p = 0.9)",
        [
            {"layout": "packed tree", "tokens": batch.num_tokens, "fwd+bwd_s": min(tree_times)},
            {"layout": "linear rows", "tokens": linear_tokens, "fwd+bwd_s": min(linear_times)},
            {"layout": "per-call rows", "tokens": per_call_tokens, "fwd+bwd_s": "-"},
        ],
    )
    print_table(
        "Jmax (k = 10 tree)",
        [
            {
                "jmax": j,
                "tokens": jtokens[j],
                "fwd+bwd_s": med[j],
                "fraction_of_all": med[j] / med["all"],
            }
            for j in ("1", "5", "all")
        ],
    )
    print(
        f"token_ratio_vs_linear={numbers['token_ratio_vs_linear']:.3f} "
        f"time_ratio_vs_linear={numbers['time_ratio_vs_linear']:.3f} "
        f"token_ratio_vs_per_call={numbers['token_ratio_vs_per_call']:.3f}"
    )


if __name__ == "__main__":
    main()
