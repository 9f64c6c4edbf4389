"""Staleness: which policy tokens are too old to train, judged per token from weight versions.

Owns `stale_token_mask` (per-token freshness against the trainer's version, docs/design.md invariant
6) and `mixed_version_calls` (calls whose completion was sampled under more than one version, e.g.
after an abort and resume across a weight sync, B11). With mixing allowed, each token keeps its
own version and behaviour logprob and is judged alone; with mixing disallowed, the caller drops
or restarts the calls this names before they reach the trainer. Knows nothing about losses.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from gyre.tito.records import ModelCall

__all__ = ["stale_token_mask", "mixed_version_calls"]


def stale_token_mask(
    version_N: torch.Tensor, trainer_version: int, max_staleness: int
) -> torch.Tensor:
    """Bool [N], True where a token may be trained: `0 <= trainer_version - version_N <=
    max_staleness` (its weight version lags the trainer's by at most `max_staleness`).

    `version_N` int [N], -1 on context tokens (always False). A version newer than the trainer's
    is False as well. Raises `ValueError` if `max_staleness < 0`.
    """
    if max_staleness < 0:
        raise ValueError(f"max_staleness={max_staleness} must be >= 0")
    age_N = trainer_version - version_N.long()
    return (version_N >= 0) & (age_N >= 0) & (age_N <= max_staleness)


def mixed_version_calls(calls: Iterable[ModelCall]) -> list[str]:
    """Ids of the calls whose completion tokens carry more than one weight version."""
    return [c.call_id for c in calls if len(set(c.versions)) > 1]
