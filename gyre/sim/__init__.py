"""gyre.sim: discrete-event cluster simulator driving the real scheduler policies (docs/design.md).

`simulate(config, policy)` runs one policy on one scenario; `compare(config)` runs Colocate,
Async (best fixed split) and Elastic on the same workload draws; `python -m gyre.sim --config
FILE` prints the table and writes timeline PNGs (`gyre.report.gantt.plot_timeline`). The
policies come from `gyre.runtime.scheduler`, the `Timeline` type from `gyre.runtime.timeline`.
"""

from gyre.runtime.timeline import Timeline
from gyre.sim.comparison import (
    Comparison,
    best_async,
    build_policy,
    compare,
    format_table,
)
from gyre.sim.config import (
    ClusterConfig,
    CostConfig,
    PolicyConfig,
    SimConfig,
    SimModelConfig,
    WorkloadConfig,
    load_sim_config,
)
from gyre.sim.engine import SimResult, SimulationStalled, Workload, simulate

__all__ = [
    "ClusterConfig",
    "Comparison",
    "CostConfig",
    "PolicyConfig",
    "SimConfig",
    "SimModelConfig",
    "SimResult",
    "SimulationStalled",
    "Timeline",
    "Workload",
    "WorkloadConfig",
    "best_async",
    "build_policy",
    "compare",
    "format_table",
    "load_sim_config",
    "simulate",
]
