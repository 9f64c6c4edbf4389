"""One execution's trajectory tree as the live run page draws it.

Owns `TreeView` (built by `TreeView.build` from an execution's model calls): the tree
(`gyre.trajectory.build_tree`), the trajectories Jmax selects (`select_trajectories`) and the
loss weight of every node taken from `pack_tree` itself, so the page shows the packed batch's
values. `outline` gives one segment per call (the nodes it added, its role, where it branches off
and why, whether a selected path runs through it); `tokens` gives a window of one segment's
tokens (decoded text, policy flag, behaviour logprob, loss weight, version), so a large tree is
sent piece by piece. Knows nothing about HTTP or run folders.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from gyre.tito.records import ModelCall
from gyre.trajectory.pack import pack_tree
from gyre.trajectory.select import select_trajectories
from gyre.trajectory.tree import TrajectoryTree, build_tree

__all__ = ["TreeView", "Decode"]

Decode = Callable[[Sequence[int]], list[str]]
"""Token IDs -> the text of each token (one string per ID)."""


def _num(x: float) -> float | None:
    return None if math.isnan(x) else float(x)


class TreeView:
    """A built tree with its selection and per-node loss weights (read-only)."""

    def __init__(
        self,
        tree: TrajectoryTree,
        calls: Sequence[ModelCall],
        mask_N: np.ndarray,
        weight_N: np.ndarray,
        selected_leaves: np.ndarray,
        num_executions: int,
    ) -> None:
        self.tree = tree
        self.calls = list(calls)
        self.mask_N = mask_N
        self.weight_N = weight_N
        self.selected_leaves = selected_leaves
        self.num_executions = num_executions

    @classmethod
    def build(
        cls,
        calls: Sequence[ModelCall],
        *,
        jmax: int,
        num_executions: int,
        role_limits: Mapping[str, int] | None = None,
    ) -> TreeView:
        """Tree, Jmax selection and `pack_tree`'s loss weights (`num_executions`: the step's
        loss denominator). Raises `ValueError` for no calls or a bad `jmax`."""
        if not calls:
            raise ValueError("an execution without model calls has no tree")
        tree = build_tree(calls)
        selection = select_trajectories(tree, jmax, role_limits=role_limits)
        packed = pack_tree(tree, selection, num_executions=max(1, num_executions))
        weight_N = np.zeros(len(tree), dtype=np.float64)
        weight_N[packed.node_T] = packed.loss_weight_T
        return cls(tree, calls, selection.node_mask_N, weight_N, selection.leaves, num_executions)

    def _segment_of(self, node: int) -> int:
        return -1 if node < 0 else int(self.tree.call_N[node])

    def outline(self) -> dict:
        """The tree's shape: its statistics, one segment per call and the selected leaves."""
        t = self.tree
        by_id = {c.call_id: c for c in self.calls}
        leaves = set(int(x) for x in t.leaves())
        selected = set(int(x) for x in self.selected_leaves)
        segments = []
        for r, call_id in enumerate(t.call_ids):
            start, n = int(t.run_start_R[r]), int(t.run_len_R[r])
            nodes = slice(start, start + n)
            parent = int(t.run_parent_R[r])
            call = by_id.get(call_id)
            div = (
                None
                if call is None or call.divergence is None
                else {
                    "reason": call.divergence.reason,
                    "index": call.divergence.index,
                    "parent_call_id": call.divergence.parent_call_id,
                }
            )
            end = int(t.end_node_R[r])
            segments.append(
                {
                    "id": r,
                    "call_id": call_id,
                    "role": t.call_roles[r],
                    "start": start,
                    "length": n,
                    "parent_segment": self._segment_of(parent),
                    "parent_node": parent,
                    "parent_offset": parent - int(t.run_start_R[self._segment_of(parent)])
                    if parent >= 0
                    else None,
                    "policy_tokens": int(np.count_nonzero(t.policy_N[nodes])),
                    "selected": bool(n and self.mask_N[nodes].any()),
                    "selected_leaf": end in selected,
                    "leaf": end in leaves,
                    "finish_reason": None if call is None else call.finish_reason,
                    "divergence": div,
                    "loss_weight_sum": float(self.weight_N[nodes].sum()),
                }
            )
        stats = t.statistics()
        return {
            "execution_id": t.execution_id,
            "statistics": {f: getattr(stats, f) for f in stats.__struct_fields__},
            "num_executions": self.num_executions,
            "segments": segments,
            "selected_leaves": [
                {
                    "node": int(x),
                    "segment": self._segment_of(int(x)),
                    "role": t.leaf_roles(np.asarray([x]))[0],
                }
                for x in self.selected_leaves
            ],
        }

    def tokens(self, segment: int, offset: int, limit: int, decode: Decode | None) -> dict:
        """Tokens `offset .. offset + limit` of `segment`: id, text, policy, behaviour logprob,
        loss weight, weight version, selected. Raises `IndexError` for an unknown segment."""
        t = self.tree
        if not 0 <= segment < len(t.call_ids):
            raise IndexError(f"segment={segment} is not in a tree of {len(t.call_ids)} calls")
        start, n = int(t.run_start_R[segment]), int(t.run_len_R[segment])
        lo = start + max(0, min(offset, n))
        hi = min(start + n, lo + max(0, limit))
        ids = [int(x) for x in t.token_N[lo:hi]]
        texts = decode(ids) if decode is not None else [f"<{i}>" for i in ids]
        rows = [
            {
                "node": k,
                "id": ids[k - lo],
                "text": texts[k - lo],
                "policy": bool(t.policy_N[k]),
                "logprob": _num(float(t.logprob_N[k])),
                "loss_weight": float(self.weight_N[k]),
                "version": int(t.version_N[k]),
                "selected": bool(self.mask_N[k]),
            }
            for k in range(lo, hi)
        ]
        return {"segment": segment, "offset": lo - start, "length": n, "tokens": rows}
