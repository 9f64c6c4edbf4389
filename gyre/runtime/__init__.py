"""gyre.runtime (see DESIGN.md): node loop, cells, scheduler policies, router, streaming trainer.

It exports the scheduler-policy seam (`gyre.runtime.scheduler`), which the node loop and the
cluster simulator (`gyre.sim`) both drive, and the `Router` in front of the rollout cells.
"""

from gyre.runtime.router import Router
from gyre.runtime.scheduler import (
    Action,
    AsyncPolicy,
    CellView,
    ColocatePolicy,
    Dispatch,
    ElasticPolicy,
    SchedulerPolicy,
    SchedulerState,
    StartStep,
    SwitchToRollout,
    SwitchToTrain,
    admission_room,
)

__all__ = [
    "Action",
    "AsyncPolicy",
    "CellView",
    "ColocatePolicy",
    "Dispatch",
    "ElasticPolicy",
    "Router",
    "SchedulerPolicy",
    "SchedulerState",
    "StartStep",
    "SwitchToRollout",
    "SwitchToTrain",
    "admission_room",
]
