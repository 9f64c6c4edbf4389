"""gyre: online RL for ultra-long-horizon LLM agents.

Public API: `run(config)` runs one node's job; `RunConfig` and `load_config` describe it.
"""

from gyre.config import RunConfig, load_config
from gyre.runtime.job import run

__all__ = ["RunConfig", "load_config", "run"]
__version__ = "0.1.0"
