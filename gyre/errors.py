"""One exception hierarchy for gyre: every error it raises on purpose derives from `GyreError`.

User-input errors also derive from `ValueError` (waits that ran out from `TimeoutError`). Each
class carries a stable wire `code` (a peer re-raises the same class, `error_from_code`), the HTTP
status and the OpenAI error `type` the proxy answers with; `grouped_errors` unwraps task groups.

    GyreError                                 500  an unexpected gyre failure
    +-- ConfigError (ValueError)              400  a run config key or value is wrong; names the key
    +-- TaskError (ValueError)                400  a task folder fails validation; names the path
    +-- RunDirError (ValueError)              400  a run folder's record is unreadable: file, line
    +-- LogCorruptError (ValueError)          500  a call-log frame before the last one is corrupt
    +-- EngineError                           502  an inference engine or cell failed
    |   +-- InvalidRequestError (ValueError)  400  the request itself is bad (prompt, sampling)
    |   |   +-- ContextLengthError            400  prompt (+ max_tokens) does not fit max_model_len
    |   +-- EngineUnavailableError            503  the engine is paused, loading, not ready or gone
    |   +-- EngineTimeoutError (TimeoutError) 504  a bounded wait on the engine ran out
    +-- CellDiedError                         500  the core cell's process died mid-run
    +-- WeightSyncError                       500  a weight load failed; the old weights still serve
    +-- ProxyError                         status  the TITO proxy refused a call (per instance)
    +-- ExecutionError                        500  an execution failed for infrastructure reasons
    |   +-- VerifierError                     500  the verifier crashed, hung or reported nothing
    +-- ToolError                             400  an agent tool call cannot be carried out
    +-- RunStalled (RuntimeError)             500  steps unfinished, nothing running, none started
    |   +-- SimulationStalled                 500  the same, in a simulated run
"""

from __future__ import annotations

__all__ = [
    "grouped_errors",
    "interrupted",
    "GyreError",
    "ConfigError",
    "TaskError",
    "RunDirError",
    "LogCorruptError",
    "EngineError",
    "InvalidRequestError",
    "ContextLengthError",
    "EngineUnavailableError",
    "EngineTimeoutError",
    "CellDiedError",
    "WeightSyncError",
    "ProxyError",
    "ExecutionError",
    "VerifierError",
    "ToolError",
    "RunStalled",
    "SimulationStalled",
    "error_from_code",
]


class GyreError(Exception):
    """Base of every error gyre raises on purpose.

    Class attributes: `code` (stable wire name), `http_status` (the status the proxy answers
    with), `http_type` (OpenAI's error `type`: ``invalid_request_error`` for a 4xx, else
    ``server_error``)."""

    code = "gyre_error"
    http_status = 500
    http_type = "server_error"


class _UserError(GyreError):
    """Mixin defaults of the user-input errors below: a 400 ``invalid_request_error``."""

    http_status = 400
    http_type = "invalid_request_error"


class ConfigError(_UserError, ValueError):
    """A run config is wrong; the message names the key (``$.engine.max_model_len``) and value."""

    code = "config_error"


class TaskError(_UserError, ValueError):
    """A task folder fails validation; the message names the path."""

    code = "task_error"


class RunDirError(_UserError, ValueError):
    """A record in a run folder cannot be read (edited or corrupted, not a torn last line); the
    message names the file and line."""

    code = "run_dir_error"


class LogCorruptError(GyreError, ValueError):
    """A call-log frame before the last one fails its checksum, length or decoding (a torn tail is
    not corrupt: the reader drops it). The message names the file and byte offset."""

    code = "log_corrupt"


class EngineError(GyreError):
    """An inference engine (or the cell hosting it) failed."""

    code = "engine_error"
    http_status = 502


class InvalidRequestError(EngineError, ValueError):
    """A generate request is invalid: empty prompt, token ID out of vocabulary, bad sampling."""

    code = "invalid_request"
    http_status = 400
    http_type = "invalid_request_error"


class ContextLengthError(InvalidRequestError):
    """The prompt does not fit in the engine's ``max_model_len``."""

    code = "context_length_exceeded"


class EngineUnavailableError(EngineError):
    """The engine cannot take the request now (paused, loading weights, shut down, unreachable)."""

    code = "engine_unavailable"
    http_status = 503


class EngineTimeoutError(EngineError, TimeoutError):
    """A bounded wait on an engine or cell ran out (docs/design.md, invariant 7)."""

    code = "engine_timeout"
    http_status = 504


class CellDiedError(GyreError):
    """The core cell's process died: its weights and optimizer state are gone."""

    code = "cell_died"


class WeightSyncError(GyreError):
    """A weight load failed or timed out; the engine keeps serving its previous weight version."""

    code = "weight_sync_error"


class ProxyError(GyreError):
    """The TITO proxy refused a call with HTTP status `status` (an instance attribute, so one class
    serves every refusal); `error_code` and `param` fill OpenAI's error body when known."""

    code = "proxy_error"

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str | None = None,
        error_code: str | None = None,
        param: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        if type is None:
            type = "invalid_request_error" if status < 500 else "server_error"
            if status == 401:
                type = "authentication_error"
        self.type = type
        self.error_code = error_code
        self.param = param

    @property
    def http_status(self) -> int:  # type: ignore[override]
        return self.status

    @property
    def http_type(self) -> str:  # type: ignore[override]
        return self.type


class ExecutionError(GyreError):
    """An execution failed for an infrastructure reason (not the agent's fault)."""

    code = "execution_error"


class VerifierError(ExecutionError):
    """The verifier itself failed (crashed, hung past its time limit, reported nothing usable).

    An infrastructure failure: the execution is `failed` with this message as its reason."""

    code = "verifier_error"


class ToolError(GyreError):
    """A tool call of the reference agent cannot be carried out; the message goes back to the
    model as the tool result (the agent recovers from it, it never ends the execution)."""

    code = "tool_error"
    http_status = 400
    http_type = "invalid_request_error"


class RunStalled(GyreError, RuntimeError):
    """The run has not finished its steps, but nothing runs (no execution, training, optimizer
    step, role switch or evaluation) and its policy starts nothing: it would wait for ever. For
    example the `async` policy, which never changes a role, after its last rollout cell died."""

    code = "run_stalled"


class SimulationStalled(RunStalled):
    """No event is pending but the simulated run has not finished its steps (a policy never
    acts)."""

    code = "simulation_stalled"


def _class_tree(cls: type[GyreError]) -> list[type[GyreError]]:
    """`cls` and every class below it, depth first."""
    out: list[type[GyreError]] = [cls]
    for sub in cls.__subclasses__():
        out += _class_tree(sub)
    return out


_BY_CODE: dict[str, type[GyreError]] = {
    cls.code: cls for cls in _class_tree(GyreError) if not cls.__name__.startswith("_")
}
"""Every public class of the tree by its `code` (a test checks the codes are unique)."""


def grouped_errors(
    exc: BaseException, kind: type[BaseException] = GyreError
) -> list[BaseException]:
    """The `kind` errors of an exception group that holds nothing else, nested groups flattened
    in order (trio and anyio raise a task's error out of its task group wrapped in a group); []
    for anything else, a bare exception included."""
    if not isinstance(exc, BaseExceptionGroup):
        return []
    match, rest = exc.split(kind)
    if match is None or rest is not None:
        return []
    out: list[BaseException] = []
    todo: list[BaseException] = [match]
    while todo:
        e = todo.pop()
        if isinstance(e, BaseExceptionGroup):
            todo.extend(reversed(e.exceptions))
        else:
            out.append(e)
    return out


def error_from_code(code: str, message: str) -> GyreError:
    """Rebuild the error a peer reported as ``{code, message}``; unknown codes give
    `EngineError`."""
    return _BY_CODE.get(code, EngineError)(message)


def interrupted(exc: BaseException) -> bool:
    """Whether `exc` is Ctrl-C: a KeyboardInterrupt, or a group of nothing else (trio and anyio
    raise it out of task groups wrapped in a `BaseExceptionGroup`), nested groups included."""
    if isinstance(exc, BaseExceptionGroup):
        _, rest = exc.split(KeyboardInterrupt)
        return rest is None
    return isinstance(exc, KeyboardInterrupt)
