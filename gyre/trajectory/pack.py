"""Packing: the selected part of trajectory trees laid out as one sequence per micro-batch.

Owns `PackedBatch`, `pack_tree` and `pack_batch`. A tree's selected nodes are laid out in DFS
preorder, so every subtree is one contiguous interval: node k is an ancestor-or-self of node q iff
`k <= q < dfs_out[k]` (packed indices). Position ids are the depth along the node's own path, and
the loss of a token is predicted from its *parent's* packed position (not the previous position).
Loss weight = 1 / (selected policy tokens of its execution) / (executions in the batch) on selected
policy tokens, each shared node once (docs/design.md invariant 3), 0 elsewhere. Several trees share
a micro-batch up to a token budget; their intervals never overlap, so they never attend to each
other. A tree over the budget gets a micro-batch of its own, cut along the tree into DFS chunks of
at most the budget (`chunk_start_C`): the trainer forwards the chunks in order, each attending to
its ancestors' cached K/V (`gyre.rl.packed_forward`), and backpropagates once.

Knows nothing about models, attention kernels or advantages (`execution_T` indexes the batch's
executions; the RL loss maps that to an advantage).

Array suffix legend: `_T` one entry per packed token, `_N` per tree node, `_R` per run (= call).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np

from gyre.trajectory.select import Selection
from gyre.trajectory.tree import TrajectoryTree

__all__ = ["PackedBatch", "pack_tree", "pack_batch"]


class PackedBatch(msgspec.Struct, frozen=True, kw_only=True):
    """One micro-batch: the selected nodes of one or more trees as a single sequence of T tokens.

    - `input_ids_T` int64 token IDs; `position_ids_T` int64 depth along the token's own path.
    - `parent_T` int64 packed index of the token's parent (-1 for a root): the position whose
      logits predict this token.
    - `dfs_out_T` int64 exclusive end of the token's subtree; `dfs_in` is `arange(T)`.
    - `loss_weight_T` float64: the weight described in the module docstring (0 off-policy).
    - `behaviour_logprob_T` float64 (nats; NaN on context tokens), `version_T` int32 (-1 on
      context tokens), `temperature_T` float64 (sampling temperature; NaN on context tokens),
      `policy_T` bool (policy token of a selected trajectory).
    - `execution_T` int32 index into `execution_ids`; `node_T` int64 node id in its tree.
    - `chunk_start_C` int64, ascending, first 0: where each DFS chunk of the forward begins (one
      chunk unless a tree was larger than the token budget).
    """

    execution_ids: tuple[str, ...]
    input_ids_T: np.ndarray
    position_ids_T: np.ndarray
    parent_T: np.ndarray
    dfs_out_T: np.ndarray
    loss_weight_T: np.ndarray
    behaviour_logprob_T: np.ndarray
    version_T: np.ndarray
    temperature_T: np.ndarray
    policy_T: np.ndarray
    execution_T: np.ndarray
    node_T: np.ndarray
    chunk_start_C: np.ndarray

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids_T.shape[0])

    def loss_positions(self) -> np.ndarray:
        """Packed indices (int64, ascending) of the tokens that carry loss (`policy_T`)."""
        return np.flatnonzero(self.policy_T)


def _layout(tree: TrajectoryTree, mask_N: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """DFS layout of the masked nodes: (node_T, parent_T, dfs_out_T) for one tree, from index 0."""
    num_runs = tree.run_start_R.shape[0]
    sel_len_R = np.bincount(tree.call_N[mask_N], minlength=num_runs).astype(np.int64)
    runs = np.flatnonzero(sel_len_R).tolist()
    children: dict[int, list[tuple[int, int]]] = {}
    roots: list[int] = []
    for r in runs:
        p = int(tree.run_parent_R[r])
        if p < 0:
            roots.append(r)
        else:
            pr = int(tree.call_N[p])
            children.setdefault(pr, []).append((p - int(tree.run_start_R[pr]), r))
    for kids in children.values():  # deepest attach point first, so each run stays contiguous
        kids.sort(key=lambda ar: (-ar[0], ar[1]))
    size: dict[int, int] = {}
    for r in reversed(runs):  # a child run's id is larger than its parent run's id
        size[r] = int(sel_len_R[r]) + sum(size[c] for _, c in children.get(r, ()))
    run_in: dict[int, int] = {}
    cursor = 0
    for r in roots:
        run_in[r] = cursor
        cursor += size[r]
    total = cursor
    node_T = np.empty(total, dtype=np.int64)
    parent_T = np.empty(total, dtype=np.int64)
    dfs_out_T = np.empty(total, dtype=np.int64)
    for r in runs:
        start, n, lo = int(tree.run_start_R[r]), int(sel_len_R[r]), run_in[r]
        kids = children.get(r, [])
        attach = np.array([a for a, _ in kids], dtype=np.int64)
        sizes = np.array([size[c] for _, c in kids], dtype=np.int64)
        after = lo + n + np.concatenate(([0], np.cumsum(sizes)))
        for (_, c), offset in zip(kids, after[:-1].tolist()):
            run_in[c] = offset
        node_T[lo : lo + n] = np.arange(start, start + n)
        parent_T[lo + 1 : lo + n] = np.arange(lo, lo + n - 1)
        p = int(tree.run_parent_R[r])
        if p < 0:
            parent_T[lo] = -1
        else:
            pr = int(tree.call_N[p])
            parent_T[lo] = run_in[pr] + p - int(tree.run_start_R[pr])
        # Children attached at index >= i lie inside node i's subtree: count them per i.
        count = np.searchsorted(-attach, -np.arange(n), side="right")
        dfs_out_T[lo : lo + n] = after[count]
    return node_T, parent_T, dfs_out_T


def pack_tree(
    tree: TrajectoryTree, selection: Selection, *, num_executions: int, execution_index: int = 0
) -> PackedBatch:
    """Pack the selected nodes of one tree; see the module docstring for the layout and weights.

    `num_executions` is the number of executions in the whole batch (the second divisor of the
    loss weight). Raises `ValueError` if the selection belongs to another tree or execution, or
    `num_executions < 1`.
    """
    if num_executions < 1:
        raise ValueError(f"num_executions={num_executions} must be >= 1")
    if selection.execution_id != tree.execution_id or selection.node_mask_N.shape[0] != len(tree):
        raise ValueError(
            f"selection of execution {selection.execution_id!r} with "
            f"{selection.node_mask_N.shape[0]} nodes does not match tree {tree.execution_id!r} "
            f"with {len(tree)} nodes"
        )
    node_T, parent_T, dfs_out_T = _layout(tree, selection.node_mask_N)
    policy_T = tree.policy_N[node_T]
    weight = 0.0 if selection.policy_tokens == 0 else 1.0 / selection.policy_tokens / num_executions
    return PackedBatch(
        execution_ids=(tree.execution_id,),
        input_ids_T=tree.token_N[node_T].astype(np.int64),
        position_ids_T=tree.depth_N[node_T].astype(np.int64),
        parent_T=parent_T,
        dfs_out_T=dfs_out_T,
        loss_weight_T=np.where(policy_T, weight, 0.0),
        behaviour_logprob_T=tree.logprob_N[node_T],
        version_T=tree.version_N[node_T],
        temperature_T=tree.temperature_N[node_T],
        policy_T=policy_T,
        execution_T=np.full(node_T.shape[0], execution_index, dtype=np.int32),
        node_T=node_T,
        chunk_start_C=np.zeros(1, dtype=np.int64),
    )


def _concat(parts: Sequence[PackedBatch]) -> PackedBatch:
    offsets = np.cumsum([0] + [p.num_tokens for p in parts[:-1]])
    return PackedBatch(
        execution_ids=tuple(e for p in parts for e in p.execution_ids),
        input_ids_T=np.concatenate([p.input_ids_T for p in parts]),
        position_ids_T=np.concatenate([p.position_ids_T for p in parts]),
        parent_T=np.concatenate(
            [np.where(p.parent_T >= 0, p.parent_T + o, -1) for p, o in zip(parts, offsets)]
        ),
        dfs_out_T=np.concatenate([p.dfs_out_T + o for p, o in zip(parts, offsets)]),
        loss_weight_T=np.concatenate([p.loss_weight_T for p in parts]),
        behaviour_logprob_T=np.concatenate([p.behaviour_logprob_T for p in parts]),
        version_T=np.concatenate([p.version_T for p in parts]),
        temperature_T=np.concatenate([p.temperature_T for p in parts]),
        policy_T=np.concatenate([p.policy_T for p in parts]),
        execution_T=np.concatenate(
            [np.full(p.num_tokens, i, np.int32) for i, p in enumerate(parts)]
        ),
        node_T=np.concatenate([p.node_T for p in parts]),
        chunk_start_C=np.zeros(1, dtype=np.int64),
    )


def pack_batch(
    items: Sequence[tuple[TrajectoryTree, Selection]],
    *,
    token_budget: int,
    num_executions: int | None = None,
) -> list[PackedBatch]:
    """Pack the selected trees of one batch into micro-batches of at most `token_budget` tokens.

    Trees are taken in order and a micro-batch is closed when the next tree would overflow it; a
    tree larger than the budget gets a micro-batch to itself, cut into DFS chunks of `token_budget`
    tokens (`PackedBatch.chunk_start_C`; the last chunk may be shorter).
    `num_executions` defaults to `len(items)` (every execution of the batch is in `items`).
    Raises `ValueError` for an empty `items` or `token_budget < 1`.
    """
    if not items:
        raise ValueError("pack_batch needs at least one (tree, selection) pair")
    if token_budget < 1:
        raise ValueError(f"token_budget={token_budget} must be >= 1")
    total = len(items) if num_executions is None else num_executions
    batches: list[PackedBatch] = []
    current: list[PackedBatch] = []
    used = 0
    for tree, selection in items:
        packed = pack_tree(tree, selection, num_executions=total)
        if packed.num_tokens > token_budget:
            if current:
                batches.append(_concat(current))
                current, used = [], 0
            starts = np.arange(0, packed.num_tokens, token_budget, dtype=np.int64)
            batches.append(msgspec.structs.replace(packed, chunk_start_C=starts))
            continue
        if current and used + packed.num_tokens > token_budget:
            batches.append(_concat(current))
            current, used = [], 0
        current.append(packed)
        used += packed.num_tokens
    if current:
        batches.append(_concat(current))
    return batches
