"""Trajectory trees: model-call records -> prefix tree -> Jmax selection -> packed micro-batches.

`build_tree` merges one execution's `ModelCall` records into a `TrajectoryTree`;
`select_trajectories` keeps at most Jmax root-to-leaf paths by role priority; `pack_batch` lays
the selected nodes of several trees out as packed sequences with tree position ids, DFS intervals
for the attention mask and per-token loss weights. Knows nothing about models or rewards.
"""

from gyre.trajectory.pack import PackedBatch, pack_batch, pack_tree
from gyre.trajectory.select import Selection, select_trajectories
from gyre.trajectory.tree import TrajectoryTree, TreeStatistics, build_tree

__all__ = [
    "TrajectoryTree",
    "TreeStatistics",
    "build_tree",
    "Selection",
    "select_trajectories",
    "PackedBatch",
    "pack_tree",
    "pack_batch",
]
