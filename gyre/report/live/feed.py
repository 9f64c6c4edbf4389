"""The live snapshot of a running elastic runtime, for the live run page.

Owns `RuntimeFeed`: attached to an `ElasticRuntime` (`attach`, from the job's wiring), it records
every execution's `Outcome` as the rollout returns it, and `snapshot()` (called on the event loop:
it reads the driver's counters, so never from a worker thread) gives the cells' roles and
activity, the water level and rollout capacity, switches, and the router's redirections and
migrations (`Router.statistics()`). Knows nothing about HTTP or the page.
"""

from __future__ import annotations

from typing import Any

from gyre.tasks.outcome import Outcome

__all__ = ["RuntimeFeed"]

_ROUTER_FIELDS = (
    "requests_routed",
    "requests_redirected",
    "requests_retried",
    "requests_migrated",
    "tokens_migrated",
    "tokens_recomputed",
    "redirect_latency_s_mean",
    "redirect_latency_s_max",
)


class _RecordingRollout:
    """The runtime's rollout, passing every returned execution's outcome to `record`."""

    def __init__(self, rollout: Any, record: Any) -> None:
        self._rollout = rollout
        self._record = record

    async def run(self, task: Any, execution_id: str) -> Any:
        executed = await self._rollout.run(task, execution_id)
        self._record(executed.outcome)
        return executed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rollout, name)


class RuntimeFeed:
    """Snapshots of one runtime; `snapshot()` is None-safe before `attach`."""

    def __init__(self) -> None:
        self.runtime: Any = None
        self.outcomes: list[Outcome] = []

    def attach(self, runtime: Any) -> None:
        """Watch `runtime` (an `ElasticRuntime` about to run)."""
        self.runtime = runtime
        runtime.rollout = _RecordingRollout(runtime.rollout, self.outcomes.append)

    def snapshot(self) -> dict | None:
        rt = self.runtime
        if rt is None:
            return None
        cells = [
            {
                "index": c.index,
                "name": c.name,
                "role": c.role,
                "target": c.target,
                "executions": len(c.executions),
                "busy": bool(c.busy),
                "alive": bool(c.alive),
                "kind": c.kind,
                "since_s": c.since,
                "engine_version": c.engine_version,
                "trainer_version": c.trainer_version,
            }
            for c in rt.state.cells
        ]
        stats = rt.router.statistics()
        return {
            "cells": cells,
            "water_level": rt.state.dispatched - rt.state.finished,
            "rollout_capacity": rt.capacity
            * sum(1 for c in rt.state.cells if c.alive and c.role == "rollout"),
            "dispatched": rt.state.dispatched,
            "finished": rt.state.finished,
            "steps_done": rt.state.steps_done,
            "switches": len(rt.state.switch_s),
            "version": rt.state.weights.version,
            "router": {f: getattr(stats, f) for f in _ROUTER_FIELDS},
            "outcomes": list(self.outcomes),
            "suspended": tuple(rt.state.suspension.queue),
            "where": {eid: c.index for c in rt.state.cells for eid in c.executions},
        }
