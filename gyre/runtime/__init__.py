"""gyre.runtime (see docs/design.md): cells, scheduler policies, the router and the RL drivers.

It holds the cell worker process and its client, the scheduler policies, the `Router` in front of
the rollout cells, the one RL driver for every cell count (`elastic`, started by `elastic_job`), the
run's weight version (`weight_version`) and the run's records (timeline, metrics and their sinks,
checkpoints, progress). Training runs in DeepSpeed trainers (`gyre.engines`) in the training cells,
which the driver hands each group as soon as it finishes when `SchedulerConfig.streaming`; there is
no trainer of its own here. It exports the scheduler-policy seam, which the node runtime and the
cluster simulator (`gyre.sim`) both drive, and the `Router`.
"""

from gyre.runtime.router import Router
from gyre.runtime.scheduler import (
    Action,
    AsyncPolicy,
    CellRole,
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
    "CellRole",
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
