"""gyre.tito: the TITO proxy (OpenAI-compatible API in, exact token records out).

`TitoProxy` serves agents and records every model call as a `ModelCall` (reference form: the
parent's shared tokens + its own new ones; `ExecutionTokens` rebuilds whole prompts on demand as
`FullCall`s); `read_log` rebuilds the call log after a run or a crash. See docs/design.md (data
path, invariant 1).

Modules: `proxy` (the ASGI app), `sessions` (keys, executions), `render` (chat to prompt IDs),
`intake` (requests to started calls), `detok` (token text), `reply` (reply parsing), `generation`
(driving the engine), `inflight` (calls in flight: disconnects, retries, closing), `openai_format`
(requests, responses, SSE), `recorder` (ModelCall records), `log` (the call log), `records`,
`wire`.
"""

from gyre.tito.log import CallLog, LogContents, LogCorruptError, LogStatistics, read_log
from gyre.tito.proxy import ProxyStatistics, TitoProxy
from gyre.tito.records import (
    ROLES,
    Divergence,
    ExecutionSummary,
    ExecutionTokens,
    FullCall,
    ModelCall,
    Role,
)
from gyre.tito.render import ChatRenderer
from gyre.tito.render_state import RenderStatistics

__all__ = [
    "TitoProxy",
    "ProxyStatistics",
    "ModelCall",
    "FullCall",
    "ExecutionTokens",
    "Divergence",
    "ExecutionSummary",
    "Role",
    "ROLES",
    "CallLog",
    "LogStatistics",
    "LogContents",
    "LogCorruptError",
    "read_log",
    "ChatRenderer",
    "RenderStatistics",
]
