"""How one agent run becomes an `Outcome`: its termination and the harness's failure rules.

Owns `AgentRun` (how the agent's process ended and what its `ExecutionControl` counted, an
outcome but the score), `failed_outcome` (an execution that failed before its agent ran) and
`nothing_to_train_on` (the rules that fail a run whose agent did run: no model call, or no sampled
token; field case B20). The harness (`gyre.agents.harness`) runs the agent and the verifier; this
module only reads what they left. Knows nothing about workspaces, uids or namespaces.
"""

from __future__ import annotations

import msgspec

from gyre.agents.control import ExecutionControl
from gyre.sandbox import ProcessResult
from gyre.tasks.outcome import Outcome, Score, Termination
from gyre.tasks.task import Task

__all__ = ["AgentRun", "failed_outcome", "nothing_to_train_on"]


def failed_outcome(task: Task, execution_id: str, reason: str) -> Outcome:
    """A failed execution that has nothing but its reason (its agent did not run to an end)."""
    return Outcome(
        execution_id=execution_id,
        task_id=task.task_id,
        termination="failed",
        failure_reason=reason,
    )


class AgentRun(msgspec.Struct, frozen=True, kw_only=True):
    """How an agent's run ended, with its model calls once it is over: the fields of its
    `Outcome` but the score and the failure reason."""

    execution_id: str
    task_id: str
    termination: Termination
    """How the agent ended (never `failed`: the failure rules decide that)."""
    exit_code: int
    model_calls: int
    completion_tokens: int
    started_s: float
    agent_s: float
    stdout_tail: str
    stderr_tail: str

    @classmethod
    def ended(
        cls,
        task: Task,
        execution_id: str,
        result: ProcessResult,
        tails: tuple[str, str],
        control: ExecutionControl,
    ) -> AgentRun:
        """The run that ended as `result` says, with the tails of its stdout and stderr; refreshes
        `control` and reads its last counters and stop reason."""
        reason_before = control.reason
        control.refresh()
        termination: Termination
        if result.ended == "exited":
            # an agent that gave up on a refused over-long prompt was cut off, not finished (B15)
            cut_off = control.reason == "context_exceeded"
            termination = "context_exceeded" if cut_off else "finished"
        elif result.ended == "deadline":
            termination = "timeout"
        else:
            assert reason_before is not None
            termination = reason_before
        return cls(
            execution_id=execution_id,
            task_id=task.task_id,
            termination=termination,
            exit_code=result.exit_code,
            model_calls=control.model_calls,
            completion_tokens=control.completion_tokens,
            started_s=result.started_s,
            agent_s=result.wall_s,
            stdout_tail=tails[0],
            stderr_tail=tails[1],
        )

    def outcome(self, *, score: Score | None = None, failure_reason: str | None = None) -> Outcome:
        """Its `Outcome`: scored, or failed for `failure_reason`."""
        fields = msgspec.structs.asdict(self)  # every field of a run is one of its outcome's
        if failure_reason is not None:
            fields["termination"] = "failed"
        return Outcome(**fields, score=score, failure_reason=failure_reason)


def nothing_to_train_on(run: AgentRun) -> str | None:
    """Why `run` is `failed` though its agent ran: no model call, or no sampled token. Nothing to
    train on: out of the loss and the group baseline (field case B20). None: it has something."""
    if run.model_calls == 0:
        how = (
            f"agent exited (status {run.exit_code})"
            if run.termination == "finished"
            else f"agent stopped ({run.termination})"
        )
        return f"{how} before its first model call: {run.stderr_tail[-500:]}"
    if run.completion_tokens == 0:
        return (
            f"no policy tokens: all {run.model_calls} model calls ended "
            "before their first token (aborted)"
        )
    return None
