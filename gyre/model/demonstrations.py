"""Demonstrations for the warm start: the reference agent's conversations, and their token IDs.

Owns `demonstrations` (fresh `learnable` conversations, the shipped suite's instructions held
out, some with the teacher's slip), `Encoded` and `encode_conversation` (a chat to token IDs and a
loss mask, segment by segment as the TITO proxy builds prompts: every assistant turn is the text
the model would generate, ending with `<|im_end|>`) and `generation_prompt` (the IDs a model
continues from after a conversation). Conversations come from `gyre.agents.oracle`, so they are
the reference agent's token for token. Knows nothing about training, engines or the proxy.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import msgspec

from gyre.config import WarmStartConfig

__all__ = ["Encoded", "demonstrations", "encode_conversation", "generation_prompt"]


@dataclass(frozen=True)
class Encoded:
    """One conversation as token IDs; `loss_mask[i]` is True for tokens the model generates."""

    ids: list[int]
    loss_mask: list[bool]


def demonstrations(settings: WarmStartConfig) -> list[dict]:
    """`settings.examples` demonstrations of the `learnable` kind, as `demonstration_for` dicts.

    Drawn with `learnable_examples(seed=settings.seed)`; an example whose instruction is one of
    the shipped suite's (generated with `settings.heldout_suite_seed`) is skipped, so every
    shipped task stays unseen. Each demonstration slips with probability `settings.slip_fraction`
    (its written word gets a trailing full stop; drawn with a fixed seed, one draw per
    demonstration in order). Deterministic for equal settings.
    """
    from gyre.agents.oracle import demonstration_for  # agents -> tasks; model code only calls them
    from gyre.tasks.suites import SUITES, learnable_examples

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


def encode_conversation(tokenizer: Any, messages: list[dict], tools: list[dict] | None) -> Encoded:
    """Token IDs of a chat as the TITO proxy would hold them, and which tokens carry loss.

    Each assistant turn is tokenized on its own as the completion the model generates (its text
    as the chat template renders it, ending with `<|im_end|>`); the text between turns (the
    template's generation prompt, tool results, the newline after `<|im_end|>`) is tokenized on
    its own and carries no loss. This is `parent prompt + parent completion + new text`, the way
    the proxy extends prompts (docs/design.md invariant 1).

    Raises:
        ValueError: the template does not render an assistant turn as a continuation of its
            generation prompt, or the conversation has no assistant turn.
    """
    ids: list[int] = []
    mask: list[bool] = []
    done = ""  # rendered text covered by `ids` so far
    eos = tokenizer.eos_token
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
        mask += [False] * len(new) + [True] * len(gen)
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
