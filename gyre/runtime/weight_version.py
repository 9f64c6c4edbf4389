"""The run's weight version: the one owner of "which weights are current".

Owns `WeightVersion` (the version of the newest published weights and the snapshot folder that
holds them) and its `WeightVersionStatistics` record. The driver (`gyre.runtime.elastic`, and the
simulator `gyre.sim.engine` with no folder) publishes after every applied optimizer step; cells,
the router and the policy snapshot read it. The versions an engine reports per token stay data on
the tokens (`gyre.engines.protocol`) and what each cell holds stays with that cell's bookkeeping;
this object only says which version is the newest. Knows nothing about cells, engines or files.
"""

from __future__ import annotations

import msgspec

__all__ = ["WeightVersion", "WeightVersionStatistics"]


class WeightVersionStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What a `WeightVersion` holds now."""

    version: int
    """The newest published weight version."""
    snapshot: str | None
    """Hugging Face folder holding those weights (None: not on disk, as in the simulator)."""
    published: int
    """Versions published since this object was made (the starting version not counted)."""


class WeightVersion:
    """The newest published weight version of a run and the folder holding its weights.

    Args:
        version: the version the run starts from (its weights at `snapshot`).
        snapshot: Hugging Face folder of those weights, or None.
    """

    __slots__ = ("_published", "_snapshot", "_version")

    def __init__(self, version: int = 0, snapshot: str | None = None) -> None:
        self._version = version
        self._snapshot = snapshot
        self._published = 0

    @property
    def version(self) -> int:
        """The newest published weight version."""
        return self._version

    @property
    def snapshot(self) -> str | None:
        """The folder holding the weights of `version` (None: not on disk)."""
        return self._snapshot

    def saved(self) -> str:
        """`snapshot`, for a driver whose weights are on disk (the node runtime); raises
        `RuntimeError` when they are not."""
        if self._snapshot is None:
            raise RuntimeError(f"weight version {self._version} has no snapshot folder")
        return self._snapshot

    def publish(self, version: int, snapshot: str | None = None) -> None:
        """Make `version` (saved at `snapshot`) the newest; versions never go back."""
        assert version >= self._version, f"weight version {version} published after {self._version}"
        self._version = version
        self._snapshot = snapshot
        self._published += 1

    def is_stale(self, held: int) -> bool:
        """Whether weights tagged `held` are older than the newest published ones."""
        return held < self._version

    def statistics(self) -> WeightVersionStatistics:
        return WeightVersionStatistics(
            version=self._version, snapshot=self._snapshot, published=self._published
        )
