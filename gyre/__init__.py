"""gyre: online RL for ultra-long-horizon LLM agents.

Public API: `run(config)` runs one node's job; `RunConfig` and `load_config` describe it. The
names load on first use (`gyre._lazy`), so `import gyre.agents.react` in an agent process does not
import the runtime and torch.
"""

import typing as _typing

from gyre._lazy import lazy_exports as _lazy_exports

if _typing.TYPE_CHECKING:
    from gyre.config import RunConfig, load_config
    from gyre.job import run

__all__ = ["RunConfig", "load_config", "run"]
__version__ = "0.1.0"

__getattr__, __dir__ = _lazy_exports(
    __name__, {"RunConfig": "gyre.config", "load_config": "gyre.config", "run": "gyre.job"}
)
