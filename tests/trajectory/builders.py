"""Test builders: model-call records by hand, random executions, a naive reference trie.

`make_call` fills the boring fields of a `FullCall` (a model call with its whole prompt: tests
write prompts whole; `build_tree` and `to_reference` put them in the records' reference form);
`random_execution` draws an execution whose calls extend, branch off and rewrite earlier calls (a
numpy RNG seeded by the caller, so hypothesis can drive it); `naive_nodes` rebuilds the node set
with one dict entry per prefix, an independent reference for `build_tree`.
"""

from __future__ import annotations

import numpy as np

from gyre.tito.records import ROLES, FullCall


def make_call(
    execution_id,
    call_id,
    prompt,
    completion,
    *,
    role="main",
    parent=None,
    logprobs=None,
    versions=None,
    finish_reason="stop",
) -> FullCall:
    n = len(completion)
    return FullCall(
        execution_id=execution_id,
        call_id=call_id,
        role=role,
        prompt_ids=list(prompt),
        completion_ids=list(completion),
        logprobs=list(logprobs) if logprobs is not None else [-0.5 - 0.01 * i for i in range(n)],
        versions=list(versions) if versions is not None else [1] * n,
        finish_reason=finish_reason,
        parent_call_id=parent,
    )


def random_execution(
    seed: int, *, execution_id: str = "e0", max_calls: int = 6, vocab: int = 8, max_new: int = 5
) -> list[FullCall]:
    """Calls that extend a previous call (+ tool tokens), branch off inside one, or start anew.

    A small vocabulary makes accidental shared prefixes (and completions landing on existing
    context nodes) likely, which is what the tree must get right.
    """
    rng = np.random.default_rng(seed)
    calls: list[FullCall] = []
    seqs: list[list[int]] = []
    for k in range(int(rng.integers(1, max_calls + 1))):
        kind = rng.integers(0, 3) if calls else 2
        parent = None
        if kind == 0:  # extend a previous call with a tool result
            j = int(rng.integers(0, len(calls)))
            prompt = seqs[j] + rng.integers(0, vocab, int(rng.integers(0, 3))).tolist()
            parent = calls[j].call_id
        elif kind == 1:  # rewrite history: keep a prefix of a previous call, then differ
            j = int(rng.integers(0, len(calls)))
            cut = int(rng.integers(1, len(seqs[j]) + 1))
            prompt = seqs[j][:cut] + rng.integers(0, vocab, int(rng.integers(1, 3))).tolist()
            parent = calls[j].call_id
        else:  # a fresh context (a sub-agent or a new root), often sharing a "system prompt"
            system = [0, 1] if rng.random() < 0.6 else []
            prompt = system + rng.integers(0, vocab, int(rng.integers(1, 4))).tolist()
        completion = rng.integers(0, vocab, int(rng.integers(0, max_new + 1))).tolist()
        logprobs = (-rng.random(len(completion)) * 3).tolist()
        versions = rng.integers(3, 6, len(completion)).tolist()
        role = ROLES[int(rng.integers(0, len(ROLES)))]
        calls.append(
            make_call(
                execution_id,
                f"c{k}",
                prompt,
                completion,
                role=role,
                parent=parent,
                logprobs=logprobs,
                versions=versions,
            )
        )
        seqs.append(prompt + completion)
    return calls


def naive_nodes(calls: list[FullCall]) -> dict[tuple[int, ...], dict]:
    """One entry per distinct prefix of any call's prompt + completion: policy flag, logprob,
    version (first sampler wins), creating call index."""
    nodes: dict[tuple[int, ...], dict] = {}
    for ci, call in enumerate(calls):
        seq = call.prompt_ids + call.completion_ids
        for i in range(len(seq)):
            key = tuple(seq[: i + 1])
            fresh = {"policy": False, "logprob": None, "version": -1, "call": ci}
            node = nodes.setdefault(key, fresh)
            j = i - len(call.prompt_ids)
            if j >= 0 and not node["policy"]:
                node.update(policy=True, logprob=call.logprobs[j], version=call.versions[j])
    return nodes
