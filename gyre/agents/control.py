"""Execution control: the counters and the stop signal of one running execution, and its API key.

Owns `ExecutionControl` (model calls and sampled tokens so far, the task's limits, the reason an
execution was stopped from outside), `mint_api_key` and `check_execution_id`. Whoever watches the
model calls feeds the control: the rollout (`gyre.rollout`) polls the proxy's running
totals into `observe_totals` through the `refresh` callback; a driver that counts calls itself
calls `note_model_call` and `context_exceeded`. The harness waits on its `event`. Knows nothing
about processes, HTTP, tokens or the proxy.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable

import anyio

from gyre.tasks.outcome import Termination

__all__ = ["ExecutionControl", "check_execution_id", "mint_api_key"]

_EXECUTION_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,199}")


def check_execution_id(execution_id: str) -> str:
    """Return `execution_id` if it is usable as a folder name and in a key, else `ValueError`."""
    if not _EXECUTION_ID.fullmatch(execution_id):
        raise ValueError(
            f"execution_id={execution_id!r} must be 1-200 characters of [A-Za-z0-9_.:-], "
            "not starting with '.', ':' or '-'"
        )
    return execution_id


def mint_api_key(execution_id: str) -> str:
    """A fresh API key naming the execution: `gyre-<execution_id>-<16 hex random>`.

    The proxy maps the key back to the execution (`execution_id` = everything between the first
    `gyre-` and the last `-`). Raises `ValueError` for an ID `check_execution_id` rejects.
    """
    check_execution_id(execution_id)
    return f"gyre-{execution_id}-{secrets.token_hex(8)}"


class ExecutionControl:
    """Counters and the stop signal of one running execution.

    Fed with running totals (`observe_totals`, e.g. from the proxy's `ExecutionSummary`, polled
    through `refresh`) or call by call (`note_model_call`, `context_exceeded`); stops the
    execution when a limit of its task is passed. Call its methods from the event loop thread that
    runs `Harness.run`.
    """

    def __init__(
        self,
        *,
        max_turns: int | None = None,
        token_budget: int | None = None,
        refresh: Callable[[ExecutionControl], None] | None = None,
    ) -> None:
        """`refresh`, if given, brings the counters up to date (e.g. `observe_totals` from the
        proxy's summary); the harness calls it once the agent has stopped, before judging."""
        self._refresh = refresh
        self.max_turns = max_turns
        self.token_budget = token_budget
        self.model_calls = 0
        """Model calls so far (every role)."""
        self.completion_tokens = 0
        """Sampled tokens so far."""
        self.reason: Termination | None = None
        """Why the execution was stopped from outside; None while it was not."""
        self._event = anyio.Event()

    @property
    def event(self) -> anyio.Event:
        """Set once when the execution must stop."""
        return self._event

    def note_model_call(self, completion_tokens: int) -> None:
        """Count one finished model call of `completion_tokens` sampled tokens; stops at a limit."""
        if completion_tokens < 0:
            raise ValueError(f"completion_tokens={completion_tokens} must be >= 0")
        self.model_calls += 1
        self.completion_tokens += completion_tokens
        if self.token_budget is not None and self.completion_tokens >= self.token_budget:
            self.stop("token_budget")
        elif self.max_turns is not None and self.model_calls >= self.max_turns:
            self.stop("turn_limit")

    def observe_totals(
        self, *, model_calls: int, completion_tokens: int, context_refusals: int = 0
    ) -> None:
        """Set the counters from running totals (e.g. the proxy's `ExecutionSummary`, polled);
        stops at a limit like `note_model_call`. Totals never go down."""
        if model_calls < self.model_calls or completion_tokens < self.completion_tokens:
            raise ValueError(
                f"totals went down: model_calls={model_calls} (was {self.model_calls}), "
                f"completion_tokens={completion_tokens} (was {self.completion_tokens})"
            )
        self.model_calls, self.completion_tokens = model_calls, completion_tokens
        if context_refusals:
            self.stop("context_exceeded")
        elif self.token_budget is not None and completion_tokens >= self.token_budget:
            self.stop("token_budget")
        elif self.max_turns is not None and model_calls >= self.max_turns:
            self.stop("turn_limit")

    def refresh(self) -> None:
        """Run the `refresh` callback, if any."""
        if self._refresh is not None:
            self._refresh(self)

    def context_exceeded(self) -> None:
        """The execution's context no longer fits the model: stop it for partial scoring."""
        self.stop("context_exceeded")

    def stop(self, reason: Termination) -> None:
        """Stop the execution with `reason`; the first reason wins."""
        if reason not in ("timeout", "turn_limit", "token_budget", "context_exceeded"):
            raise ValueError(f"reason={reason!r} is not a stop reason")
        if self.reason is None:
            self.reason = reason
            self._event.set()
