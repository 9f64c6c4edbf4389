"""gyre's one exception tree (`gyre/errors.py`): every class round-trips the cell wire by its
`code`, and carries the HTTP status and OpenAI error type its docstring's tree gives."""

from __future__ import annotations

import pytest

import gyre.errors as errors

# (class, base that user code may catch, HTTP status, OpenAI type), read off the module's tree.
TREE = [
    ("GyreError", Exception, 500, "server_error"),
    ("ConfigError", ValueError, 400, "invalid_request_error"),
    ("TaskError", ValueError, 400, "invalid_request_error"),
    ("RunDirError", ValueError, 400, "invalid_request_error"),
    ("LogCorruptError", ValueError, 500, "server_error"),
    ("EngineError", errors.GyreError, 502, "server_error"),
    ("InvalidRequestError", ValueError, 400, "invalid_request_error"),
    ("ContextLengthError", errors.InvalidRequestError, 400, "invalid_request_error"),
    ("EngineUnavailableError", errors.EngineError, 503, "server_error"),
    ("EngineTimeoutError", TimeoutError, 504, "server_error"),
    ("CellDiedError", errors.GyreError, 500, "server_error"),
    ("WeightSyncError", errors.GyreError, 500, "server_error"),
    ("ExecutionError", errors.GyreError, 500, "server_error"),
    ("VerifierError", errors.ExecutionError, 500, "server_error"),
    ("ToolError", errors.GyreError, 400, "invalid_request_error"),
    ("RunStalled", RuntimeError, 500, "server_error"),
    ("SimulationStalled", errors.RunStalled, 500, "server_error"),
]


@pytest.mark.parametrize(("name", "base", "status", "type_"), TREE)
def test_each_class_has_its_place_status_and_wire_code(name, base, status, type_):
    cls = getattr(errors, name)
    assert issubclass(cls, errors.GyreError) and issubclass(cls, base)
    exc = cls("boom")
    assert (exc.http_status, exc.http_type) == (status, type_)
    back = errors.error_from_code(cls.code, "boom")
    assert type(back) is cls and str(back) == "boom"


def test_the_tree_is_complete_and_codes_are_unique():
    classes = [
        n for n in errors.__all__ if n not in ("error_from_code", "grouped_errors", "interrupted")
    ]
    assert sorted(classes) == sorted([*(row[0] for row in TREE), "ProxyError"])
    codes = [getattr(errors, n).code for n in classes]
    assert len(set(codes)) == len(codes)


def test_proxy_error_status_is_per_instance_and_unknown_codes_are_engine_errors():
    assert errors.ProxyError("x", status=401).http_type == "authentication_error"
    assert errors.ProxyError("x", status=503).http_status == 503
    assert errors.ProxyError("x", status=503).http_type == "server_error"
    assert type(errors.error_from_code("no_such_code", "m")) is errors.EngineError


def test_grouped_errors_flattens_a_group_of_nothing_else_in_order():
    from gyre.errors import ConfigError, EngineError, GyreError, grouped_errors

    a, b, c = EngineError("a"), ConfigError("b"), EngineError("c")
    nested = BaseExceptionGroup("outer", [a, BaseExceptionGroup("inner", [b, c])])
    assert grouped_errors(nested) == [a, b, c]
    assert grouped_errors(nested, EngineError) == []  # b is no EngineError
    assert grouped_errors(BaseExceptionGroup("g", [a, c]), EngineError) == [a, c]
    assert grouped_errors(ExceptionGroup("g", [a, ValueError("x")])) == []  # something else too
    assert grouped_errors(BaseExceptionGroup("g", [a, KeyboardInterrupt()])) == []
    assert grouped_errors(a) == [] and grouped_errors(GyreError("bare")) == []


def test_interrupted_is_ctrl_c_alone_however_grouped() -> None:
    """Ctrl-C as trio and anyio raise it out of (nested) task groups counts; a group that also
    holds another error does not (that error must not be hidden as an interruption)."""
    from gyre.errors import interrupted

    ki = KeyboardInterrupt()
    assert interrupted(ki)
    assert interrupted(BaseExceptionGroup("g", [ki]))
    assert interrupted(BaseExceptionGroup("g", [BaseExceptionGroup("inner", [ki]), ki]))
    assert not interrupted(BaseExceptionGroup("g", [ki, ValueError("x")]))
    assert not interrupted(ValueError("x"))
