"""Jmax selection: which root-to-leaf trajectories of one execution are admitted to training.

Owns `Selection` and `select_trajectories`. Trajectories are ranked by role priority
(`gyre.tito.records.ROLES`: main > main_summary > sub_agent > sub_agent_summary), then by policy
tokens on the path (most first), then by leaf node id (earliest first), and the first `jmax` are
kept, optionally with a cap per role. Knows nothing about packing, rewards or models.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
import numpy as np

from gyre.tito.records import ROLES, Role
from gyre.trajectory.tree import TrajectoryTree

__all__ = ["Selection", "select_trajectories"]


class Selection(msgspec.Struct, frozen=True, kw_only=True):
    """The trajectories of one tree admitted to training, and the nodes they cover.

    `leaves` (int64 node ids) in rank order; `roles` the role of each; `node_mask_N` (bool, one
    per tree node) is True on every node of a selected root path; `policy_tokens` counts the
    policy nodes under that mask, each shared node once (the per-execution loss denominator).
    """

    execution_id: str
    leaves: np.ndarray
    roles: tuple[Role, ...]
    node_mask_N: np.ndarray
    policy_tokens: int


def select_trajectories(
    tree: TrajectoryTree, jmax: int, *, role_limits: Mapping[str, int] | None = None
) -> Selection:
    """Keep at most `jmax` trajectories of `tree` (and at most `role_limits[role]` of a role).

    Ranking: role priority, then policy tokens on the path (descending), then leaf id. Raises
    `ValueError` if `jmax < 1`, a role limit is negative, or a role limit names an unknown role.
    """
    if jmax < 1:
        raise ValueError(f"jmax={jmax} must be >= 1")
    limits = dict(role_limits or {})
    for role, limit in limits.items():
        if role not in ROLES:
            raise ValueError(f"role_limits key {role!r} is not one of {ROLES}")
        if limit < 0:
            raise ValueError(f"role_limits[{role!r}]={limit} must be >= 0")
    leaves = tree.leaves()
    priority = tree.role_N[leaves].astype(np.int64)
    policy = tree.path_policy_N[leaves].astype(np.int64)
    order = np.lexsort((leaves, -policy, priority))  # last key is the primary one
    chosen: list[int] = []
    taken: dict[str, int] = {}
    for idx in order:
        role = ROLES[int(priority[idx])]
        if taken.get(role, 0) >= limits.get(role, jmax):
            continue
        taken[role] = taken.get(role, 0) + 1
        chosen.append(int(leaves[idx]))
        if len(chosen) == jmax:
            break
    chosen_leaves = np.asarray(chosen, dtype=np.int64)
    mask = ancestor_mask(tree, chosen_leaves)
    return Selection(
        execution_id=tree.execution_id,
        leaves=chosen_leaves,
        roles=tuple(tree.leaf_roles(chosen_leaves)),
        node_mask_N=mask,
        policy_tokens=int(np.count_nonzero(tree.policy_N & mask)),
    )


def ancestor_mask(tree: TrajectoryTree, nodes: np.ndarray) -> np.ndarray:
    """Bool mask (one per node) of every node on the root path of any of `nodes`.

    Walks runs, not tokens: within a run the covered nodes are a prefix, so each run is visited
    at most once from its deepest covered node.
    """
    mask = np.zeros(len(tree), dtype=bool)
    deepest: dict[int, int] = {}  # run -> deepest covered node index inside the run
    for node in nodes.tolist():
        run = int(tree.call_N[node])
        deepest[run] = max(deepest.get(run, -1), node - int(tree.run_start_R[run]))
    # Runs are created in order and a run's parent lies in an earlier run: go from last to first.
    pending = sorted(deepest, reverse=True)
    while pending:
        run = pending.pop(0)
        start = int(tree.run_start_R[run])
        mask[start : start + deepest[run] + 1] = True
        parent = int(tree.run_parent_R[run])
        if parent >= 0:
            prun = int(tree.call_N[parent])
            inside = parent - int(tree.run_start_R[prun])
            if prun not in deepest:
                deepest[prun] = inside
                _insert_desc(pending, prun)
            elif inside > deepest[prun]:
                deepest[prun] = inside
    return mask


def _insert_desc(items: list[int], value: int) -> None:
    lo, hi = 0, len(items)
    while lo < hi:
        mid = (lo + hi) // 2
        if items[mid] > value:
            lo = mid + 1
        else:
            hi = mid
    items.insert(lo, value)
