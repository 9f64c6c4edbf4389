"""gyre.sandbox: process isolation for the commands gyre runs on a node (agents and verifiers).

A command runs as a supervised process tree (`run_supervised`, through the standard-library-only
`supervisor.py`): resource `Limits`, an outside deadline and a stop event, optionally another uid
and a private mount (and network) namespace described by `Mounts`, or a sealed network namespace
whose one way out is a `Relay`; nothing of the tree outlives the call; descriptors may be handed
over (`pass_fds`). `pyhost.py` is the Python host, the one process that imports untrusted code
for a trusted caller (the sealed verifier). Knows nothing about tasks, agents, models or scores:
`gyre.tasks` (verifiers) and `gyre.agents` (the harness) build on it.
"""

from gyre.sandbox.mounts import Mounts, mount_namespace_problem
from gyre.sandbox.network import Relay, network_namespace_problem
from gyre.sandbox.supervised import Limits, ProcessResult, run_supervised, tail

__all__ = [
    "Limits",
    "Mounts",
    "ProcessResult",
    "Relay",
    "run_supervised",
    "mount_namespace_problem",
    "network_namespace_problem",
    "tail",
]
