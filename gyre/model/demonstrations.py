"""Demonstrations for the warm start: the reference agent's conversations, and their token IDs.

Owns `demonstrations` (fresh conversations of `WarmStartConfig.suite`'s kind, the shipped suite's
tasks held out, some with the teacher's slip), `chain_conversations` (every conversation the
reference agent has on one `learnable-long` chain: main history segments, its compaction summary,
the sub-agent), `Encoded` and `encode_conversation` (a chat to token IDs and a loss mask, segment by
segment as the TITO proxy builds prompts: every assistant turn is the text the model would generate,
ending with `<|im_end|>`), `generation_prompt` (the IDs a model continues from after a
conversation), and `tool_call` (one assistant tool-call message). `learnable` conversations come
from `gyre.agents.oracle`, chains are played by the rules of `gyre.agents.react` here, so both are
the reference agent's token for token. Knows nothing about training, engines or the proxy.
"""

from __future__ import annotations

import json
import random
import tempfile
from dataclasses import dataclass
from typing import Any

import msgspec

from gyre.config import WarmStartConfig

__all__ = [
    "Encoded",
    "chain_conversations",
    "demonstrations",
    "encode_conversation",
    "generation_prompt",
    "tool_call",
]


@dataclass(frozen=True)
class Encoded:
    """One conversation as token IDs; `loss_mask[i]` is True for tokens the model generates."""

    ids: list[int]
    loss_mask: list[bool]


def demonstrations(settings: WarmStartConfig) -> list[dict]:
    """The warm start's conversations: `{"messages", "tools", ...}` dicts, optionally with
    `"loss": "last"` (only the last assistant turn is the model's; the others are history).

    `settings.suite == "learnable-long"`: `chain_conversations` of `settings.examples` chains
    drawn with `learnable_long_examples(seed=settings.seed)`, the shipped suite's chains
    (`settings.heldout_suite_seed`) skipped; a chain slips with probability `slip_fraction`
    (every word it writes, the sub-agent's included, gets a trailing full stop).

    `"learnable"`: `settings.examples` demonstrations, as `demonstration_for` dicts.

    Drawn with `learnable_examples(seed=settings.seed)`; an example whose instruction is one of
    the shipped suite's (generated with `settings.heldout_suite_seed`) is skipped, so every
    shipped task stays unseen. Each demonstration slips with probability `settings.slip_fraction`
    (its written word gets a trailing full stop; drawn with a fixed seed, one draw per
    demonstration in order). Deterministic for equal settings.
    """
    from gyre.agents.oracle import demonstration_for  # agents -> tasks; model code only calls them
    from gyre.tasks.suites import SUITES, learnable_examples

    if settings.suite == "learnable-long":
        return _chain_demonstrations(settings)

    heldout = {t.instruction for t in SUITES["learnable"](settings.heldout_suite_seed)}
    draw = settings.examples * 2 + 16
    while True:
        pairs = [(i, s) for i, s in learnable_examples(draw, settings.seed) if i not in heldout]
        if len(pairs) >= settings.examples:
            break
        draw *= 2
    slips = random.Random("slip")
    return [
        demonstration_for(i, _slipped(s) if slips.random() < settings.slip_fraction else s)
        for i, s in pairs[: settings.examples]
    ]


def _chain_demonstrations(settings: WarmStartConfig) -> list[dict]:
    from gyre.tasks.suites.learnable_long import learnable_long_chores, learnable_long_examples

    heldout = set(learnable_long_chores(settings.heldout_suite_seed))
    drawn = learnable_long_examples(settings.examples * 2 + 16, settings.seed)
    chores = [c for c in drawn if c not in heldout][: settings.examples]
    slips = random.Random("slip")
    out: list[dict] = []
    for chore in chores:
        out += chain_conversations(chore, slip=slips.random() < settings.slip_fraction)
    return out


def tool_call(name: str, arguments: dict, call_id: str) -> dict:
    """An OpenAI Chat assistant message that makes one tool call, `name(arguments)`, with
    `arguments` serialised by `json.dumps` (the reference agent's form) and id `call_id`."""
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


def chain_conversations(chore: Any, *, slip: bool = False, compact_chars: int = 0) -> list[dict]:
    """Every conversation the reference agent (`gyre.agents.react`) has on one `learnable-long`
    chain played perfectly, each a `{"messages", "tools"}` dict ending with an assistant turn.

    The main history is compacted as the agent does with `--compact-chars compact_chars` (0:
    the suite's `COMPACT_CHARS`): before a call whose history is longer (`history_chars`, the
    agent's own measure), the agent asks for a summary (`COMPACT_PROMPT`, no tools; its
    conversation has `"loss": "last"`, the answer is `LongChore.summary_after`) and restarts
    from `progress_prompt(INSTRUCTION, summary)`. So
    the list holds the main segments in order, each summary after the segment it ends, and the
    sub-agent's conversation after the segment that delegated. Tool results are real (the notes
    on a temporary workspace; `delegate` answers the sub-agent's `finish` summary). `slip`: each
    written word gets a trailing full stop."""
    from gyre.agents.oracle import FINISH_SUMMARY
    from gyre.agents.react import COMPACT_PROMPT, history_chars, progress_prompt
    from gyre.agents.tools import (
        SUB_AGENT_PROMPT,
        SUB_AGENT_TOOL_SCHEMAS,
        SYSTEM_PROMPT,
        TOOL_SCHEMAS,
        Workspace,
    )
    from gyre.tasks.suites.learnable_long import COMPACT_CHARS, INSTRUCTION

    limit = compact_chars or COMPACT_CHARS
    out: list[dict] = []
    subs: list[dict] = []
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": INSTRUCTION},
    ]
    with tempfile.TemporaryDirectory(prefix="gyre-chain-") as tmp:
        ws = Workspace(tmp)
        for name, text in chore.environment().items():
            ws.write_file(name, text)
        steps = chore.solution().main
        for turn in range(len(steps) + 1):
            if history_chars(messages) > limit:
                summary = chore.summary_after(turn)
                out.append({"messages": messages, "tools": TOOL_SCHEMAS})
                out += subs
                subs = []
                ask = [*messages, {"role": "user", "content": COMPACT_PROMPT}]
                answer = {"role": "assistant", "content": summary}
                out.append({"messages": [*ask, answer], "tools": None, "loss": "last"})
                progress = progress_prompt(INSTRUCTION, summary)
                messages = [
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": progress},
                ]
            if turn == len(steps):
                messages.append(tool_call("finish", {"summary": FINISH_SUMMARY}, f"call_{turn}"))
                break
            step = steps[turn]
            args = dict(step.arguments)
            if step.tool == "write_file" and slip:
                args["content"] += "."
            call = tool_call(step.tool, args, f"call_{turn}")
            messages.append(call)
            if step.tool == "delegate":
                (sub_step,) = chore.solution().sub_agents[args["task"]]
                sub_args = dict(sub_step.arguments)
                if slip:
                    sub_args["content"] += "."
                sub_call = tool_call("write_file", sub_args, "call_sub_0")
                sub = [
                    {"role": "system", "content": SUB_AGENT_PROMPT},
                    {"role": "user", "content": args["task"]},
                    sub_call,
                    {
                        "role": "tool",
                        "tool_call_id": "call_sub_0",
                        "content": ws.write_file(**sub_args),
                    },
                    tool_call("finish", {"summary": FINISH_SUMMARY}, "call_sub_1"),
                ]
                subs.append({"messages": sub, "tools": SUB_AGENT_TOOL_SCHEMAS})
                result = FINISH_SUMMARY
            else:
                result = getattr(ws, step.tool)(**args)
            messages.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": result})
    out.append({"messages": messages, "tools": TOOL_SCHEMAS})
    return out + subs


def _slipped(solution: Any) -> Any:
    """The teacher's habit: every `write_file` step writes its content with a trailing full stop
    (the oracle then runs it, so tool results stay true); the word test fails after it."""
    steps = [
        msgspec.structs.replace(
            step,
            arguments={**step.arguments, "content": step.arguments["content"] + "."},
            tests_passing=1,
        )
        if step.tool == "write_file"
        else step
        for step in solution.main
    ]
    return msgspec.structs.replace(solution, main=steps)


def _render(
    tokenizer: Any, messages: list[dict], tools: list[dict] | None, generation_prompt: bool
) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt
    )


def encode_conversation(
    tokenizer: Any, messages: list[dict], tools: list[dict] | None, *, last_only: bool = False
) -> Encoded:
    """Token IDs of a chat as the TITO proxy would hold them, and which tokens carry loss.

    Each assistant turn is tokenized on its own as the completion the model generates (its text
    as the chat template renders it, ending with `<|im_end|>`); the text between turns (the
    template's generation prompt, tool results, the newline after `<|im_end|>`) is tokenized on
    its own and carries no loss. This is `parent prompt + parent completion + new text`, the way
    the proxy extends prompts (docs/design.md invariant 1). `last_only`: only the last assistant
    turn carries loss (the earlier ones are history the agent sent back, e.g. under a compaction
    prompt).

    Raises:
        ValueError: the template does not render an assistant turn as a continuation of its
            generation prompt, or the conversation has no assistant turn.
    """
    ids: list[int] = []
    mask: list[bool] = []
    done = ""  # rendered text covered by `ids` so far
    eos = tokenizer.eos_token
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prompt = _render(tokenizer, messages[:i], tools, True)
        full = _render(tokenizer, messages[: i + 1], tools, False)
        if not prompt.startswith(done) or not full.startswith(prompt):
            raise ValueError(
                f"message {i}: the template's render of the turn does not extend the prompt"
            )
        completion = full[len(prompt) :]
        end = completion.find(eos)
        if end < 0:
            raise ValueError(f"message {i}: rendered assistant turn has no {eos!r}: {completion!r}")
        completion = completion[: end + len(eos)]
        new = tokenizer.encode(prompt[len(done) :], add_special_tokens=False)
        gen = tokenizer.encode(completion, add_special_tokens=False)
        ids += new + gen
        mask += [False] * len(new) + [not last_only or i == last] * len(gen)
        done = prompt + completion
    if not any(mask):
        raise ValueError("the conversation has no assistant turn")
    return Encoded(ids=ids, loss_mask=mask)


def generation_prompt(tokenizer: Any, messages: list[dict], tools: list[dict] | None) -> list[int]:
    """Token IDs the model continues from after `messages`: the conversation plus an empty
    assistant turn, encoded like `encode_conversation`, without that turn's `<|im_end|>`."""
    ids = encode_conversation(
        tokenizer, [*messages, {"role": "assistant", "content": ""}], tools
    ).ids
    return ids[: len(ids) - 1]
