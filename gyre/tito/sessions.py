"""Sessions of the TITO proxy: which execution a request belongs to, and that execution's state.

Owns `Sessions` (API keys minted by the launcher, one per execution; `mint_key`, `resolve`,
`close`) and `Execution` (its render state, recorded calls in reference form (O(its tokens):
`gyre.tito.records.ModelCall`), truncation flag and counters). The
bearer key names the execution; an `X-Gyre-Execution` header may name it instead. Unknown or
closed keys are refused with 401 before anything is recorded. Knows nothing about HTTP bodies,
tokens or engines.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

from gyre.errors import ProxyError
from gyre.tito.records import ROLES, ExecutionSummary, ExecutionTokens, FullCall, ModelCall, Role
from gyre.tito.render_state import RenderState

__all__ = ["Execution", "Sessions", "parse_role"]


@dataclass(slots=True)
class Execution:
    """What the proxy holds for one open execution."""

    execution_id: str
    key: str
    render: RenderState = field(default_factory=RenderState)
    records: list[ModelCall] = field(default_factory=list)
    """Recorded calls in reference form (each holds its own new tokens only), in record order."""
    truncated: bool = False
    """Any call cut off (`length`) or refused for the context limit (B14, B15)."""
    closed: bool = False
    """Set when the execution ends (`Recorder.seal`, from `InFlight.end_execution`) once its
    calls are settled: its records are final; a record that comes later is dropped, never written
    after the execution's end entry (B29)."""
    context_refusals: int = 0
    next_call: int = 0
    length_calls: int = 0
    divergences: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, call: ModelCall) -> None:
        """Keep a recorded call (O(its new tokens): the record references its parent)."""
        self.records.append(call)
        self.length_calls += call.finish_reason == "length"
        self.truncated |= call.finish_reason == "length"
        self.divergences += call.divergence is not None
        self.prompt_tokens += call.prompt_len
        self.completion_tokens += len(call.completion_ids)

    def calls(self) -> list[ModelCall]:
        """Every recorded call in reference form, in record order (a new list of the same
        records: O(calls))."""
        return list(self.records)

    def full_calls(self) -> list[FullCall]:
        """Every recorded call with its whole prompt (`FullCall`), rebuilt on demand:
        O(calls x history), for clients that ask for it (`?full=1`) and tests."""
        return ExecutionTokens(self.records).full_calls()

    def new_call_id(self) -> str:
        """`c<k>`: unique within the execution, in arrival order."""
        call_id = f"c{self.next_call}"
        self.next_call += 1
        return call_id

    def summary(self) -> ExecutionSummary:
        return ExecutionSummary(
            execution_id=self.execution_id,
            num_calls=len(self.records),
            truncated=self.truncated,
            length_calls=self.length_calls,
            context_refusals=self.context_refusals,
            divergences=self.divergences,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            closed_s=time.time(),
        )


def parse_role(header: str | None) -> Role:
    """The `X-Gyre-Role` header as a `Role` (default `main`); ProxyError 400 for anything else."""
    if header is None or header == "":
        return "main"
    if header not in ROLES:
        raise ProxyError(f"X-Gyre-Role {header!r} is not one of {', '.join(ROLES)}", status=400)
    return header  # type: ignore[return-value]


class Sessions:
    """API keys and open executions. Not thread-safe: used from the node's event loop only."""

    def __init__(self) -> None:
        self._by_key: dict[str, Execution] = {}
        self._by_id: dict[str, Execution] = {}

    def mint_key(self, execution_id: str) -> str:
        """Open `execution_id` and return its API key (`gyre-<random>`), for `OPENAI_API_KEY`.

        Raises ValueError if the execution is already open or the ID is empty."""
        if not execution_id:
            raise ValueError(f"execution_id={execution_id!r} must not be empty")
        if execution_id in self._by_id:
            raise ValueError(f"execution {execution_id!r} is already open")
        key = f"gyre-{secrets.token_urlsafe(18)}"
        ex = Execution(execution_id=execution_id, key=key)
        self._by_key[key] = ex
        self._by_id[execution_id] = ex
        return key

    def resolve(self, authorization: str | None, execution_header: str | None) -> Execution:
        """The open execution a request belongs to.

        `Authorization: Bearer <key>` names it; `X-Gyre-Execution: <id>` may name an open
        execution instead, and must agree with the key when both are given.
        Raises ProxyError(401) for a missing, unknown or closed key or execution.
        """
        ex = None
        if authorization:
            scheme, _, token = authorization.partition(" ")
            if scheme.lower() == "bearer":
                ex = self._by_key.get(token.strip())
        if execution_header:
            named = self._by_id.get(execution_header)
            if named is None or (ex is not None and ex is not named):
                raise ProxyError(
                    f"unknown or closed execution {execution_header!r}",
                    status=401,
                    type="authentication_error",
                )
            ex = named
        if ex is None:
            raise ProxyError(
                "invalid API key: it names no open execution",
                status=401,
                type="authentication_error",
            )
        return ex

    def get(self, execution_id: str) -> Execution | None:
        """The open execution with this ID, or None."""
        return self._by_id.get(execution_id)

    def pop(self, execution_id: str) -> Execution:
        """Close an execution: its key stops working. Raises KeyError if it is not open."""
        ex = self._by_id.pop(execution_id)
        del self._by_key[ex.key]
        return ex

    def open_executions(self) -> list[str]:
        return list(self._by_id)
