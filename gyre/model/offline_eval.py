"""Offline evaluation of a warm-started model: the reference agent's loop played with transformers.

Owns `offline_pass_rate` and its result `OfflineEval`: each `learnable` task is played as the
reference agent would (its system prompt, tools and message format), prompts encoded like
`gyre.model.demonstrations.generation_prompt`, tool calls run on a temporary workspace, and the
written file scored as the hidden tests do; `offline_chain_eval` and its `OfflineChainEval` do
the same for `learnable-long` chains (sub-agents, compaction, partial credit per file). A quick
check, not the proxy: replies are re-rendered. Knows nothing about engines, the proxy or RL.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from gyre.model.demonstrations import generation_prompt

__all__ = ["OfflineChainEval", "OfflineEval", "offline_chain_eval", "offline_pass_rate"]


class OfflineEval(msgspec.Struct, frozen=True, kw_only=True):
    """Result of `offline_pass_rate`."""

    tasks: int
    samples: int
    """Conversations played (tasks x samples per task)."""
    passed: int
    """Conversations after which the file held the word (the hidden tests' check)."""
    pass_rate: float
    mean_reward: float
    """Mean fraction of the two hidden tests passed (file exists; file holds the word)."""
    first_call_ok: float
    """Fraction whose first reply was exactly the reference `write_file` call."""
    finished: float
    """Fraction that ended with a `finish` call."""


def _sample(
    model: Any,
    prompt_ids: list[int],
    eos_id: int,
    max_new_tokens: int,
    temperature: float,
    generator: Any,
) -> list[int]:
    import torch

    out: list[int] = []
    cache = None
    inp = torch.tensor(prompt_ids)[None]
    with torch.no_grad():
        for _ in range(max_new_tokens):
            res = model(input_ids=inp, past_key_values=cache, use_cache=True)
            cache = res.past_key_values
            logits_V = res.logits[0, -1].float()
            if temperature == 0:
                tok = int(logits_V.argmax())
            else:
                probs = torch.softmax(logits_V / temperature, dim=-1)
                tok = int(torch.multinomial(probs, 1, generator=generator))
            out.append(tok)
            if tok == eos_id:
                break
            inp = torch.tensor([[tok]])
    return out


def offline_pass_rate(
    model_dir: str | os.PathLike[str],
    tasks: Sequence[tuple[str, str, str]],
    *,
    samples: int = 1,
    temperature: float = 0.0,
    max_turns: int = 4,
    max_new_tokens: int = 96,
    seed: int = 0,
) -> OfflineEval:
    """Play the reference agent's loop with transformers on `learnable` tasks and score them.

    Each conversation is the reference agent's (its system prompt, tools and message format):
    prompt IDs are the conversation encoded like `encode_conversation` (re-rendered, so a reply
    the template would render differently is re-tokenized: an estimate, not the proxy). Tool calls
    `write_file`, `read_file` and `list_dir` run on a fresh temporary workspace; `run` and
    `delegate` are answered with an error (nothing from the model is executed). It ends on
    `finish`, a reply without tool calls, or after `max_turns` replies; it passes when
    `path` holds `word` (whitespace stripped), as the hidden tests check.

    Args:
        tasks: (instruction, word, path) triples, e.g. from the suite's oracle solutions.
        samples: conversations per task; temperature: 0 is greedy, else plain softmax sampling.
    Raises:
        ValueError: samples < 1, temperature < 0, max_turns < 1 or no tasks.
    """
    if samples < 1 or temperature < 0 or max_turns < 1 or not tasks:
        raise ValueError(
            f"{samples=} must be >= 1, {temperature=} >= 0, {max_turns=} >= 1, "
            f"tasks={len(tasks)} > 0"
        )
    from gyre.agents.tools import SYSTEM_PROMPT, TOOL_SCHEMAS, ToolError, Workspace
    from gyre.tito.reply import parse_reply

    tokenizer, model, gen = _load(model_dir, seed)
    passed = first_ok = finished = tests = 0
    for instruction, word, path in tasks:
        reference = {"path": path, "content": word}
        for _ in range(samples):
            with tempfile.TemporaryDirectory(prefix="gyre-sft-eval-") as tmp:
                ws = Workspace(tmp)
                messages: list[dict] = [
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": instruction},
                ]
                for turn in range(max_turns):
                    prompt_ids = generation_prompt(tokenizer, messages, TOOL_SCHEMAS)
                    out = _sample(
                        model, prompt_ids, tokenizer.eos_token_id, max_new_tokens, temperature, gen
                    )
                    text = tokenizer.decode(out, skip_special_tokens=False).removesuffix(
                        tokenizer.eos_token
                    )
                    reply = parse_reply(text, f"call_{turn}")
                    calls = reply.tool_calls
                    if turn == 0 and len(calls) == 1 and calls[0].function.name == "write_file":
                        first_ok += _loads(calls[0].function.arguments) == reference
                    messages.append(
                        {
                            "role": "assistant",
                            "content": reply.content,
                            "tool_calls": [
                                {
                                    "id": c.id,
                                    "type": "function",
                                    "function": {
                                        "name": c.function.name,
                                        "arguments": c.function.arguments,
                                    },
                                }
                                for c in calls
                            ]
                            or None,
                        }
                    )
                    if not calls:
                        break
                    done = False
                    for c in calls:
                        args = _loads(c.function.arguments)
                        name = c.function.name
                        try:
                            if not isinstance(args, dict):
                                result = f"error: invalid arguments for {name}"
                            elif name == "finish":
                                result, done = str(args.get("summary", "")), True
                            elif name == "write_file":
                                result = ws.write_file(
                                    args.get("path", ""), args.get("content", "")
                                )
                            elif name == "read_file":
                                result = ws.read_file(args.get("path", ""))
                            elif name == "list_dir":
                                result = ws.list_dir(args.get("path", "."))
                            else:
                                result = f"error: {name!r} is not available in the offline check"
                        except ToolError as exc:
                            result = f"error: {exc}"
                        except OSError as exc:
                            result = f"error: {exc.strerror or exc}"
                        messages.append({"role": "tool", "tool_call_id": c.id, "content": result})
                    if done:
                        finished += 1
                        break
                target = Path(tmp) / path
                ok = target.is_file() and target.read_text(errors="replace").strip() == word
                passed += ok
                tests += target.is_file() + ok
    n = len(tasks) * samples
    return OfflineEval(
        tasks=len(tasks),
        samples=n,
        passed=passed,
        pass_rate=passed / n,
        mean_reward=tests / (2 * n),
        first_call_ok=first_ok / n,
        finished=finished / n,
    )


def _load(model_dir: str | os.PathLike[str], seed: int) -> tuple[Any, Any, Any]:
    """(tokenizer, float32 model in eval mode, CPU generator seeded with `seed`) of `model_dir`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return tokenizer, model, torch.Generator().manual_seed(seed)


def _loads(text: str | dict[str, Any]) -> Any:
    """Tool-call arguments as a JSON value (None when `text` is not JSON); an object as it is."""
    if isinstance(text, dict):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return None


class OfflineChainEval(msgspec.Struct, frozen=True, kw_only=True):
    """Result of `offline_chain_eval`."""

    tasks: int
    samples: int
    """Executions played (tasks x samples per task)."""
    passed: int
    """Executions after which every file held its word."""
    pass_rate: float
    mean_reward: float
    """Mean share of files right (the hidden tests' partial credit)."""
    mean_calls: float
    """Model calls per execution: main, sub-agent and summary calls."""
    delegated: float
    """Share of executions that ran a sub-agent."""
    compacted: float
    """Share of executions that compacted their main history at least once."""
    finished: float
    """Share of executions whose main conversation ended with a `finish` call."""


class _ChainPlayer:
    """The reference agent's rules (`gyre.agents.react`) played with transformers on one
    workspace: tools, `delegate` to a sub-agent, compaction past `compact_chars`."""

    def __init__(self, model, tokenizer, ws, *, compact_chars, max_calls, sample) -> None:
        self.model, self.tokenizer, self.ws = model, tokenizer, ws
        self.compact_chars, self.max_calls, self.sample = compact_chars, max_calls, sample
        self.calls = 0
        self.delegated = self.compacted = False

    def _reply(self, messages: list[dict], tools: list[dict] | None):
        from gyre.tito.reply import parse_reply

        self.calls += 1
        out = self.sample(generation_prompt(self.tokenizer, messages, tools))
        eos = self.tokenizer.eos_token
        text = self.tokenizer.decode(out, skip_special_tokens=False).removesuffix(eos)
        return parse_reply(text, f"call_{self.calls}")

    def converse(self, task: str, *, sub_agent: bool) -> tuple[str, bool]:
        """One conversation to `finish`, a reply without a call or the call limit: (summary,
        finished?)."""
        from gyre.agents.react import COMPACT_PROMPT, history_chars, progress_prompt
        from gyre.agents.tools import (
            SUB_AGENT_PROMPT,
            SUB_AGENT_TOOL_SCHEMAS,
            SYSTEM_PROMPT,
            TOOL_SCHEMAS,
        )

        system = SUB_AGENT_PROMPT if sub_agent else SYSTEM_PROMPT
        tools = SUB_AGENT_TOOL_SCHEMAS if sub_agent else TOOL_SCHEMAS
        messages: list[dict] = [
            {"role": "system", "content": system},
            {"role": "user", "content": task},
        ]
        while self.calls < self.max_calls:
            if self.compact_chars and history_chars(messages) > self.compact_chars:
                ask = [*messages, {"role": "user", "content": COMPACT_PROMPT}]
                summary = self._reply(ask, None).content or ""
                self.compacted = self.compacted or not sub_agent
                progress = progress_prompt(task, summary)
                messages = [messages[0], {"role": "user", "content": progress}]
                continue
            reply = self._reply(messages, tools)
            calls = reply.tool_calls
            messages.append(
                {
                    "role": "assistant",
                    "content": reply.content,
                    "tool_calls": [
                        {"id": c.id, "type": "function", "function": _function(c)} for c in calls
                    ]
                    or None,
                }
            )
            if not calls:
                return reply.content or "", False
            for c in calls:
                result, done = self._tool(c.function.name, _loads(c.function.arguments), sub_agent)
                if done:
                    return result, True
                messages.append({"role": "tool", "tool_call_id": c.id, "content": result})
        return "stopped at the call limit", False

    def _tool(self, name: str, args: Any, sub_agent: bool) -> tuple[str, bool]:
        from gyre.agents.tools import ToolError

        if not isinstance(args, dict) or not all(isinstance(v, str) for v in args.values()):
            return f"error: invalid arguments for {name}", False
        try:
            if name == "finish":
                return args.get("summary", ""), True
            if name == "delegate" and not sub_agent and "task" in args:
                self.delegated = True
                return self.converse(args["task"], sub_agent=True)[0], False
            if name == "write_file":
                return self.ws.write_file(args.get("path", ""), args.get("content", "")), False
            if name == "read_file":
                return self.ws.read_file(args.get("path", "")), False
            if name == "list_dir":
                return self.ws.list_dir(args.get("path", ".")), False
            return f"error: {name!r} is not available in the offline check", False
        except ToolError as exc:
            return f"error: {exc}", False
        except OSError as exc:
            return f"error: {exc.strerror or exc}", False


def offline_chain_eval(
    model_dir: str | os.PathLike[str],
    chores: Sequence[Any],
    *,
    samples: int = 1,
    temperature: float = 0.0,
    max_calls: int = 14,
    max_new_tokens: int = 64,
    compact_chars: int = 0,
    seed: int = 0,
) -> OfflineChainEval:
    """Play the reference agent on `learnable-long` chains with transformers and score them.

    Each execution follows `gyre.agents.react`'s rules: the main conversation with its tools,
    `delegate` running a sub-agent conversation, the history compacted past `compact_chars`
    (0: the suite's `COMPACT_CHARS`) with a summary call; prompts encoded like
    `generation_prompt` (re-rendered: an estimate, not the proxy). `write_file`, `read_file` and
    `list_dir` run on a temporary workspace holding the chain's notes; `run` is answered with an
    error. An execution ends at the main `finish`, a main reply without a call, or after
    `max_calls` model calls in all (the suite's `max_turns`); its reward is the share of files
    holding their word (whitespace stripped), as the hidden tests check.

    Args:
        chores: `gyre.tasks.suites.learnable_long.LongChore`s (e.g. `learnable_long_chores(0)`).
        samples: executions per chain; temperature: 0 is greedy, else plain softmax sampling.
    Raises:
        ValueError: samples < 1, temperature < 0, max_calls < 1 or no chores.
    """
    if samples < 1 or temperature < 0 or max_calls < 1 or not chores:
        raise ValueError(
            f"{samples=} must be >= 1, {temperature=} >= 0, {max_calls=} >= 1, "
            f"chores={len(chores)} > 0"
        )
    from gyre.agents.tools import Workspace
    from gyre.tasks.suites.learnable_long import COMPACT_CHARS, INSTRUCTION

    tokenizer, model, gen = _load(model_dir, seed)

    def sample(prompt_ids: list[int]) -> list[int]:
        eos = tokenizer.eos_token_id
        return _sample(model, prompt_ids, eos, max_new_tokens, temperature, gen)

    passed = calls = delegated = compacted = finished = 0
    reward = 0.0
    for chore in chores:
        for _ in range(samples):
            with tempfile.TemporaryDirectory(prefix="gyre-chain-eval-") as tmp:
                ws = Workspace(tmp)
                for name, text in chore.environment().items():
                    ws.write_file(name, text)
                player = _ChainPlayer(
                    model,
                    tokenizer,
                    ws,
                    compact_chars=compact_chars or COMPACT_CHARS,
                    max_calls=max_calls,
                    sample=sample,
                )
                finished += player.converse(INSTRUCTION, sub_agent=False)[1]
                right = 0
                for word, path in zip(chore.words, chore.files):
                    target = Path(tmp) / path
                    right += target.is_file() and target.read_text(errors="replace").strip() == word
                passed += right == len(chore.words)
                reward += right / len(chore.words)
                calls += player.calls
                delegated += player.delegated
                compacted += player.compacted
    n = len(chores) * samples
    return OfflineChainEval(
        tasks=len(chores),
        samples=n,
        passed=passed,
        pass_rate=passed / n,
        mean_reward=reward / n,
        mean_calls=calls / n,
        delegated=delegated / n,
        compacted=compacted / n,
        finished=finished / n,
    )


def _function(call: Any) -> dict:
    return {"name": call.function.name, "arguments": call.function.arguments}
