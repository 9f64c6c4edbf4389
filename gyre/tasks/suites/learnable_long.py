"""The `learnable-long` suite: a chain of `learnable` chores, many model calls per execution.

Owns `learnable_long_suite` (the 32 shipped tasks), `learnable_long_examples` (fresh tasks of the
same kind, drawn with their own seed, for warm-start demonstrations), `LongChore` (one drawn
chain, with what a perfect agent writes when it compacts its history) and the chain's constants.
A task is `NOTES` notes in the workspace, `note0.txt` to `note3.txt`; each says 'Write the word
"W" to the file "F". Then read the file note<i+1>.txt.' (the last: "Then call finish."), and one
of them asks to delegate its write to a sub-agent. Words and file names come from `WORDS` and
`FILES`: each is one token of the reference tiny tokenizer, quoted in the note as in the call's
JSON, so following a note means copying tokens, not spelling a word out. A perfect agent makes
2 main calls per note (read, then write or delegate), the sub-agent 2 (write, finish), plus
`finish`: 11 calls, 14 with the 3 compactions at `COMPACT_CHARS`. The hidden tests check each
file (partial credit per file). Knows nothing about agents, models or the other suites.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gyre.tasks.solution import Solution, Step
from gyre.tasks.suites.files import TaskFiles

__all__ = [
    "COMPACT_CHARS",
    "COMPACTIONS",
    "FILES",
    "INSTRUCTION",
    "LongChore",
    "NOTES",
    "PERFECT_CALLS",
    "TURN_SLACK",
    "WORDS",
    "learnable_long_chores",
    "learnable_long_examples",
    "learnable_long_suite",
]

NOTES = 4
"""Notes (written files) per task."""
WORDS = (
    "agent",
    "class",
    "config",
    "error",
    "function",
    "key",
    "line",
    "list",
    "module",
    "number",
    "output",
    "package",
    "result",
    "string",
    "system",
    "value",
)
"""The words a note asks for. Each is one token of the reference tiny tokenizer
(`gyre.model.recipe`) both after a space and after a quote, the two ways it appears in a note and
in a `write_file` call, so the model copies a token. With `learnable`'s words, which that
tokenizer spells in 2-5 pieces that differ between the note and the call's JSON, the tiny model
never learned to follow a note (`gyre.model.sft`'s docstring)."""
FILES = (
    "main.txt",
    "test.txt",
    "input.txt",
    "spec.txt",
    "user.txt",
    "task.txt",
    "name.txt",
    "count.txt",
)
"""The files a note names; each stem is one token of that tokenizer, like `WORDS`."""
INSTRUCTION = "Follow the notes. Read the file note0.txt and do what it says.\n"
"""Every task's instruction: the chores are in the notes, so each one is read before it is done."""
COMPACT_CHARS = 400
"""The reference agent's `--compact-chars` this suite is made for (`examples/cpu.toml`, the warm
start's demonstrations and the offline evaluation use it). Measured with
`gyre.agents.react.history_chars` on 600 drawn chains (with and without the slip), a perfect
agent's main history passes it 3 times, each right after it reads note1, note2 and note3 and
before that note's chore is done, so every summary has to carry a chore (the note's text). The
same holds for any limit from 380 to 420; at 600 it is compacted once (dedup ratio of the
trajectory tree 1.34), at 400 three times (1.94: each restart repeats the system prompt and
tools, 776 tokens, which the tree holds once). A sub-agent's history stays under 280."""
TURN_SLACK = 2
"""Model calls a task allows beyond a perfect execution's (`max_turns` in `task.toml`): an agent
that wastes more (a wrong path, a malformed call) is stopped there and partially scored."""
COMPACTIONS = NOTES - 1
"""Compactions of a perfect execution's main history at `COMPACT_CHARS`: after reading note1 to
note3."""
PERFECT_CALLS = 2 * NOTES + 1 + 2 + COMPACTIONS
"""Model calls of a perfect execution: a read and a write (or delegate) per note, `finish`, the
sub-agent's write and `finish`, a summary per compaction."""


@dataclass(frozen=True)
class LongChore:
    """One drawn chain: `words[i]` goes to `files[i]`; note `delegated` is a sub-agent's."""

    words: tuple[str, ...]
    files: tuple[str, ...]
    delegated: int

    def note(self, i: int) -> str:
        """The text of `note<i>.txt`."""
        chore = self._chore(i)
        if i == self.delegated:
            chore = f"Delegate to a sub-agent: {chore}"
        after = f"Then read the file note{i + 1}.txt." if i + 1 < NOTES else "Then call finish."
        return f"{chore} {after}"

    def _chore(self, i: int) -> str:
        return f'Write the word "{self.words[i]}" to the file "{self.files[i]}".'

    def sub_task(self) -> str:
        """The delegated chore, as the main agent passes it to `delegate`."""
        return self._chore(self.delegated)

    def environment(self) -> dict[str, str]:
        return {f"note{i}.txt": self.note(i) for i in range(NOTES)}

    def solution(self) -> Solution:
        """The reference tool calls: per note a `read_file`, then its `write_file` or
        `delegate`; `tests_passing` counts the files written so far."""
        main: list[Step] = []
        for i in range(NOTES):
            main.append(Step(tool="read_file", arguments={"path": f"note{i}.txt"}, tests_passing=i))
            if i == self.delegated:
                main.append(Step(tool="delegate", arguments={"task": self.sub_task()}))
            else:
                write = {"path": self.files[i], "content": self.words[i]}
                main.append(Step(tool="write_file", arguments=write))
            main[-1] = Step(tool=main[-1].tool, arguments=main[-1].arguments, tests_passing=i + 1)
        write = {"path": self.files[self.delegated], "content": self.words[self.delegated]}
        return Solution(
            main=main, sub_agents={self.sub_task(): [Step(tool="write_file", arguments=write)]}
        )

    def summary_after(self, done: int) -> str:
        """What a perfect agent answers to the compaction prompt after `done` main steps of
        `solution()`: the text of the note read last when its chore is not done yet (so the chore
        survives the compaction), else the next read ("Read the file note2.txt."), else "Call
        finish." Raises `ValueError` for `done` outside [1, 2 * NOTES]."""
        if not 1 <= done <= 2 * NOTES:
            raise ValueError(f"done={done} must be in [1, {2 * NOTES}]")
        if done % 2 == 1:
            return self.note(done // 2)
        if done == 2 * NOTES:
            return "Call finish."
        return f"Read the file note{done // 2}.txt."


def _draw(rng: random.Random) -> LongChore:
    return LongChore(
        words=tuple(rng.sample(WORDS, NOTES)),
        files=tuple(rng.sample(FILES, NOTES)),
        delegated=rng.randrange(NOTES),
    )


def _tests(chore: LongChore) -> str:
    body = (
        '"""Hidden tests (generated): one per file, so the score is the share of files right."""\n'
    )
    for i, (word, path) in enumerate(zip(chore.words, chore.files)):
        body += (
            f"\n\ndef test_file_{i}():\n"
            f"    import os\n"
            f"    assert os.path.isfile({path!r}) and open({path!r}).read().strip() == {word!r}\n"
        )
    return body


def _task(index: int, chore: LongChore) -> TaskFiles:
    return TaskFiles(
        name=f"{index:03d}-{chore.words[0]}-{chore.delegated}",
        instruction=INSTRUCTION,
        difficulty=2,
        tags=("learnable", "long-horizon", "sub-agent"),
        deadline_s=300.0,
        max_turns=PERFECT_CALLS + TURN_SLACK,
        token_budget=4096,
        group_size=4,
        environment=chore.environment(),
        tests={"test_files.py": _tests(chore)},
        solution=chore.solution(),
        num_tests=NOTES,
        verifier_timeout_s=60.0,
    )


def learnable_long_examples(count: int, seed: int) -> list[LongChore]:
    """`count` chains of the suite's kind for demonstrations, drawn with their own seed (use one
    other than the suite's; equal chains to shipped tasks are the caller's to skip). Raises
    `ValueError` for count < 0."""
    if count < 0:
        raise ValueError(f"count={count} must be >= 0")
    rng = random.Random(f"{seed}:learnable-long-demos")
    return [_draw(rng) for _ in range(count)]


def learnable_long_chores(seed: int) -> list[LongChore]:
    """The 32 chains of the shipped suite for `seed` (distinct)."""
    rng = random.Random(f"{seed}:learnable-long")
    out: list[LongChore] = []
    while len(out) < 32:
        chore = _draw(rng)
        if chore not in out:
            out.append(chore)
    return out


def learnable_long_suite(seed: int) -> list[TaskFiles]:
    """The 32 `learnable-long` tasks of `seed` (one per chain of `learnable_long_chores(seed)`,
    in that order), as files in the format of `gyre.tasks.task`; equal seeds give equal tasks."""
    return [_task(i, c) for i, c in enumerate(learnable_long_chores(seed))]
