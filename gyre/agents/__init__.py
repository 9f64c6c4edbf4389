"""gyre.agents: the harness that runs agent processes, the reference agent and its tools (see DESIGN.md)."""

from gyre.agents.harness import REACT_AGENT, ExecutionControl, Harness, HarnessStatistics, mint_api_key
from gyre.agents.oracle import demonstration, demonstration_for, oracle_reply
from gyre.agents.tools import ToolError, Workspace

__all__ = [
    "Harness", "HarnessStatistics", "ExecutionControl", "mint_api_key", "REACT_AGENT",
    "Workspace", "ToolError",
    "oracle_reply", "demonstration", "demonstration_for",
]
