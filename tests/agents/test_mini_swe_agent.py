"""mini-swe-agent (PyPI `mini-swe-agent`, its `mini` command line, default settings) runs through
the harness on one shipped task: the harness launches it with nothing but the environment gyre
gives every agent (`gyre.agents.environment`: `MSWEA_MODEL_NAME=openai/<model>` through litellm
to `OPENAI_BASE_URL`), the TITO proxy records its calls, and the verifier scores the workspace.

The engine is scripted: it samples, as token IDs, actions that run the task's oracle commands,
then mini-swe-agent's submit command. mini-swe-agent 2's default (`mini.yaml`) asks for actions
as tool calls (its `BASH_TOOL`; the tiny format's `<tool_call>` blocks, answered as OpenAI
`tool_calls`); its text-based setting (`mini_textbased.yaml`, `LitellmTextbasedModel`) for bash
code blocks in the reply text.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import anyio
import pytest

from gyre.agents.control import ExecutionControl
from gyre.agents.harness import Harness
from gyre.config import ProxyConfig
from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from gyre.tasks.solution import load_solution
from gyre.tasks.task import load_task

pytest.importorskip("minisweagent", reason="mini-swe-agent is in the `test` extra")
pytest.importorskip("tokenizers")
from gyre.model.recipe import build_tokenizer  # noqa: E402
from gyre.tito.proxy import TitoProxy  # noqa: E402

TASK = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "terminal-mini" / "000-env"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""mini-swe-agent's end of a task (`mini.yaml`: the first output line of a successful command)."""


def mini(*options: str) -> tuple[str, ...]:
    """`mini` as a user runs it, the task read from the instruction file the harness writes; the
    model is left to `MSWEA_MODEL_NAME`."""
    return (
        "/bin/sh",
        "-c",
        'exec "$0" -m minisweagent.run.mini --yolo --exit-immediately '
        f"{' '.join(options)} -c agent.step_limit=8 "
        '-o "$HOME/trajectory.json" -t "$(cat "$GYRE_INSTRUCTION_FILE")"',
        sys.executable,
    )


def tool_call(command: str) -> str:
    return (
        f"<tool_call>{json.dumps({'name': 'bash', 'arguments': {'command': command}})}</tool_call>"
    )


def code_block(command: str) -> str:
    return f"THOUGHT: one step.\n\n```mswea_bash_command\n{command}\n```"


SETTINGS = {
    "tool_calls": (mini("-c mini.yaml"), tool_call),
    "text": (mini("-c mini_textbased.yaml --model-class litellm_textbased"), code_block),
}


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


def bash_commands(task) -> list[str]:
    """The oracle's steps as shell commands, then the submit command."""
    commands = []
    for step in load_solution(task).main:
        if step.tool == "run":
            commands.append(step.arguments["command"])
        else:
            assert step.tool == "write_file", step.tool
            args = step.arguments
            commands.append(
                f"printf %s {shlex.quote(args['content'])} > {shlex.quote(args['path'])}"
            )
    return [*commands, SUBMIT]


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("setting", sorted(SETTINGS))
async def test_mini_swe_agent_solves_a_shipped_task_through_the_harness(
    tmp_path: Path, setting: str
) -> None:
    tok = build_tokenizer()
    task = load_task(TASK)
    commands = bash_commands(task)
    command_line, action = SETTINGS[setting]
    texts = [action(command) for command in commands]
    replies = [
        ScriptedReply(token_ids=tok.encode(text, add_special_tokens=False) + [tok.eos_token_id])
        for text in texts
    ]
    engine = ScriptedEngine(
        replies, eos_token_id=tok.eos_token_id, max_model_len=65536, vocab_size=len(tok)
    )
    proxy = TitoProxy(tokenizer=tok, engine_for=lambda _e: engine, config=ProxyConfig())
    eid = "mswea-1"
    key = proxy.mint_key(eid)

    def refresh(c: ExecutionControl) -> None:
        s = proxy.summary(eid)
        c.observe_totals(
            model_calls=s.num_calls,
            completion_tokens=s.completion_tokens,
            context_refusals=s.context_refusals,
        )

    control = ExecutionControl(refresh=refresh)
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.serve)
        harness = Harness(
            base_url=f"http://127.0.0.1:{port}/v1",
            agent_command=command_line,
            workspace_root=tmp_path / "executions",
        )
        outcome = await harness.run(task, eid, control=control, api_key=key)
        tg.cancel_scope.cancel()
    calls = proxy.calls(eid, full=True)
    assert outcome.termination == "finished", (outcome.failure_reason, outcome.stderr_tail)
    assert outcome.exit_code == 0, outcome.stdout_tail
    # one model call per action, each recorded token for token as the engine sampled it
    assert [c.completion_ids for c in calls] == [r.token_ids for r in replies]
    assert outcome.model_calls == len(commands) == 2
    assert outcome.score.all_passed and outcome.score.score == 1.0
    # each request extends the previous one: its prompt starts with the previous prompt + reply
    for before, after in zip(calls, calls[1:]):
        head = [*before.prompt_ids, *before.completion_ids]
        assert after.prompt_ids[: len(head)] == head
