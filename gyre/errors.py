"""One exception hierarchy for gyre.

Every error gyre raises on purpose derives from `GyreError`; user-input errors also derive from
`ValueError` so callers that only know the standard library still catch them.

    GyreError
    +-- ConfigError (ValueError)          a run config key or value is wrong; names the key
    +-- TaskError (ValueError)            a task folder fails validation; names the path
    +-- RunDirError (ValueError)          a run folder's record is unreadable; names file and line
    +-- EngineError                       an inference engine or cell failed
    |   +-- InvalidRequestError (ValueError)  the request itself is bad (prompt, sampling params)
    |   |   +-- ContextLengthError            prompt (+ max_tokens) does not fit max_model_len
    |   +-- EngineUnavailableError            the engine is paused, loading, not ready or gone
    |   +-- EngineTimeoutError (TimeoutError) a bounded wait on the engine ran out
    +-- WeightSyncError                   a weight load failed; the engine keeps its old version
    +-- ProxyError                        the TITO proxy refused a call (carries an HTTP status)
    +-- ExecutionError                    an execution failed for infrastructure reasons

`EngineError` subclasses carry a stable `code` string so they survive the cell wire: the cell
server sends `{code, message}` and the client re-raises the same class (`error_from_code`).
"""

from __future__ import annotations

__all__ = [
    "GyreError",
    "ConfigError",
    "TaskError",
    "RunDirError",
    "EngineError",
    "InvalidRequestError",
    "ContextLengthError",
    "EngineUnavailableError",
    "EngineTimeoutError",
    "WeightSyncError",
    "ProxyError",
    "ExecutionError",
    "error_from_code",
]


class GyreError(Exception):
    """Base of every error gyre raises on purpose."""

    code = "gyre_error"


class ConfigError(GyreError, ValueError):
    """A run config is wrong; the message names the key (``$.engine.max_model_len``) and value."""

    code = "config_error"


class TaskError(GyreError, ValueError):
    """A task folder fails validation; the message names the path."""

    code = "task_error"


class RunDirError(GyreError, ValueError):
    """A record in a run folder cannot be read (edited or corrupted, not a torn last line); the
    message names the file and line."""

    code = "run_dir_error"


class EngineError(GyreError):
    """An inference engine (or the cell hosting it) failed."""

    code = "engine_error"


class InvalidRequestError(EngineError, ValueError):
    """A generate request is invalid: empty prompt, token ID out of vocabulary, bad sampling."""

    code = "invalid_request"


class ContextLengthError(InvalidRequestError):
    """The prompt does not fit in the engine's ``max_model_len``."""

    code = "context_length_exceeded"


class EngineUnavailableError(EngineError):
    """The engine cannot take the request now (paused, loading weights, shut down, unreachable)."""

    code = "engine_unavailable"


class EngineTimeoutError(EngineError, TimeoutError):
    """A bounded wait on an engine or cell ran out (DESIGN.md invariant 7)."""

    code = "engine_timeout"


class WeightSyncError(GyreError):
    """A weight load failed or timed out; the engine keeps serving its previous weight version."""

    code = "weight_sync_error"


class ProxyError(GyreError):
    """The TITO proxy refused a call; ``status`` is the HTTP status it answers with."""

    code = "proxy_error"

    def __init__(self, message: str, *, status: int = 400, type: str = "invalid_request_error"):
        super().__init__(message)
        self.status = status
        self.type = type


class ExecutionError(GyreError):
    """An execution failed for an infrastructure reason (not the agent's fault)."""

    code = "execution_error"


_BY_CODE: dict[str, type[GyreError]] = {
    cls.code: cls
    for cls in (
        GyreError,
        EngineError,
        InvalidRequestError,
        ContextLengthError,
        EngineUnavailableError,
        EngineTimeoutError,
        WeightSyncError,
    )
}


def error_from_code(code: str, message: str) -> GyreError:
    """Rebuild the error a peer reported as ``{code, message}``; unknown codes give `EngineError`."""
    return _BY_CODE.get(code, EngineError)(message)
