"""gyre.runtime (see DESIGN.md): the node's job, cells and the RL drivers that move them.

It holds the job (`job.run`), the one-cell colocate loop (`loop`), cell worker processes and
their client (`cell`, `cell_client`, `cell_wire`, `grad_group`), the scheduler policies
(`scheduler`), the `Router` in front of the rollout cells, the elastic driver over many cells
(`elastic`, with `cell_handle`, `batch_formation` and the run's `weight_version`), and the run's
records (`timeline`, `metrics`, `checkpoint`, `progress`). Training runs in DeepSpeed trainers
(`gyre.engines`: in the node for the one-cell loop, in the training cells for the elastic driver,
which hands them each finished group when `SchedulerConfig.streaming`); there is no trainer of
its own here. It exports the scheduler-policy seam, which the node runtime and the cluster
simulator (`gyre.sim`) both drive, and the `Router`.
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
