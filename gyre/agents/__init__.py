"""gyre.agents: the harness that runs agent processes (their control and isolation), the reference
agent and its tools (see docs/design.md).

The names load on first use (`gyre._lazy`): the agent process imports `gyre.agents.tools`, which
must not import the harness."""

from __future__ import annotations

import typing

from gyre._lazy import lazy_exports as _lazy_exports

if typing.TYPE_CHECKING:
    from gyre.agents.control import ExecutionControl, mint_api_key
    from gyre.agents.harness import REACT_AGENT, Harness, HarnessStatistics
    from gyre.agents.oracle import demonstration, demonstration_for, oracle_reply
    from gyre.agents.tools import ToolError, Workspace

__all__ = [
    "Harness",
    "HarnessStatistics",
    "ExecutionControl",
    "mint_api_key",
    "REACT_AGENT",
    "Workspace",
    "ToolError",
    "oracle_reply",
    "demonstration",
    "demonstration_for",
]

__getattr__, __dir__ = _lazy_exports(
    __name__,
    {
        **dict.fromkeys(["Harness", "HarnessStatistics", "REACT_AGENT"], "gyre.agents.harness"),
        **dict.fromkeys(["ExecutionControl", "mint_api_key"], "gyre.agents.control"),
        **dict.fromkeys(["Workspace", "ToolError"], "gyre.agents.tools"),
        **dict.fromkeys(
            ["oracle_reply", "demonstration", "demonstration_for"], "gyre.agents.oracle"
        ),
    },
)
