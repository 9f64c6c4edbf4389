"""The run's weight version: published by the step, read by everyone else."""

from __future__ import annotations

import pytest

from gyre.runtime.weight_version import WeightVersion, WeightVersionStatistics


def test_publish_moves_version_and_snapshot_together() -> None:
    weights = WeightVersion(3, "model")
    assert (weights.version, weights.snapshot) == (3, "model")
    assert weights.is_stale(2) and not weights.is_stale(3)
    weights.publish(4, "snapshots/v4")
    assert (weights.version, weights.snapshot) == (4, "snapshots/v4")
    assert weights.is_stale(3) and not weights.is_stale(4)
    assert weights.statistics() == WeightVersionStatistics(
        version=4, snapshot="snapshots/v4", published=1
    )


def test_the_simulator_form_has_no_folder() -> None:
    weights = WeightVersion()
    weights.publish(weights.version + 1)
    weights.publish(weights.version + 1)
    assert weights.statistics() == WeightVersionStatistics(version=2, snapshot=None, published=2)


def test_versions_never_go_back() -> None:
    weights = WeightVersion(2)
    with pytest.raises(AssertionError, match="weight version 1 published after 2"):
        weights.publish(1)


def test_saved_is_the_snapshot_and_refuses_weights_not_on_disk() -> None:
    assert WeightVersion(3, "model").saved() == "model"
    with pytest.raises(RuntimeError, match="weight version 2 has no snapshot folder"):
        WeightVersion(2).saved()
