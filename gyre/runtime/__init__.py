"""gyre.runtime (see docs/design.md): the RL driver and the run's records.

It holds the scheduler policies, the one RL driver for every cell count (`elastic`, started by
`elastic_job`), its state (`driver_state`), resume (`elastic_resume`), held-out evaluation, the
run's weight version (`weight_version`) and the run's records (timeline, metrics and their sinks,
checkpoints, progress). Cells are `gyre.cell`, the router in front of them `gyre.routing`, where
executions come from `gyre.rollout`. It exports the scheduler-policy seam, which the node runtime
and the cluster simulator (`gyre.sim`) both drive.
"""

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
    "SchedulerPolicy",
    "SchedulerState",
    "StartStep",
    "SwitchToRollout",
    "SwitchToTrain",
    "admission_room",
]
