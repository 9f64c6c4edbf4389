"""The `learnable-long` suite: chains of notes, deterministic, partial credit per file, and the
main job's config (`examples/cpu.toml`) that trains on it."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from gyre.agents.tools import Workspace
from gyre.config import load_config
from gyre.tasks.scorer import verify
from gyre.tasks.solution import load_solution
from gyre.tasks.suites import SUITES
from gyre.tasks.suites.learnable_long import (
    COMPACT_CHARS,
    FILES,
    INSTRUCTION,
    NOTES,
    PERFECT_CALLS,
    TURN_SLACK,
    WORDS,
    LongChore,
    learnable_long_chores,
    learnable_long_examples,
)
from gyre.tasks.task import load_suite

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "examples" / "tasks" / "learnable-long"
CHORE = LongChore(
    words=("apple", "river", "stone", "cloud"),
    files=("a.txt", "b.txt", "x.txt", "out.txt"),
    delegated=2,
)


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


def test_generation_is_deterministic_and_seeded() -> None:
    a, b = SUITES["learnable-long"](0), SUITES["learnable-long"](0)
    assert [(t.name, t.environment, t.tests) for t in a] == [
        (t.name, t.environment, t.tests) for t in b
    ]
    assert learnable_long_chores(0) != learnable_long_chores(1)
    assert len(set(learnable_long_chores(0))) == 32
    assert learnable_long_examples(20, seed=1) == learnable_long_examples(20, seed=1)
    with pytest.raises(ValueError, match="count=-1"):
        learnable_long_examples(-1, seed=1)


def test_the_notes_chain_and_parse() -> None:
    assert CHORE.note(0) == (
        'Write the word "apple" to the file "a.txt". Then read the file note1.txt.'
    )
    assert CHORE.note(2) == (
        'Delegate to a sub-agent: Write the word "stone" to the file "x.txt". '
        "Then read the file note3.txt."
    )
    assert CHORE.note(3) == 'Write the word "cloud" to the file "out.txt". Then call finish.'
    note = re.compile(
        r'(Delegate to a sub-agent: )?Write the word "(\w+)" to the file "([\w.]+)"\. '
        r"Then (read the file (note\d\.txt)|call finish)\."
    )
    for task in load_suite(SUITE):
        assert task.instruction == INSTRUCTION
        notes = sorted((task.environment_dir).iterdir())
        assert [p.name for p in notes] == [f"note{i}.txt" for i in range(NOTES)]
        parsed = [note.fullmatch(p.read_text()) for p in notes]
        assert all(parsed)
        assert {m.group(2) for m in parsed} <= set(WORDS)
        assert {m.group(3) for m in parsed} <= set(FILES)
        assert sum(m.group(1) is not None for m in parsed) == 1  # one sub-agent per task
        assert [m.group(5) for m in parsed] == ["note1.txt", "note2.txt", "note3.txt", None]
        # 8 main calls, finish, the sub-agent's 2, 3 summaries; 2 spare
        assert task.spec.agent.max_turns == PERFECT_CALLS + TURN_SLACK == 16


def test_solution_and_compaction_summary() -> None:
    solution = CHORE.solution()
    assert [s.tool for s in solution.main] == ["read_file", "write_file"] * 2 + [
        "read_file",
        "delegate",
        "read_file",
        "write_file",
    ]
    assert [s.tests_passing for s in solution.main] == [0, 1, 1, 2, 2, 3, 3, 4]
    task = 'Write the word "stone" to the file "x.txt".'
    assert solution.sub_agents == {task: [solution.sub_agents[task][0]]}
    assert solution.sub_agents[task][0].arguments == {
        "path": "x.txt",
        "content": "stone",
    }
    assert CHORE.summary_after(4) == "Read the file note2.txt."
    assert CHORE.summary_after(5) == CHORE.note(2)
    assert CHORE.summary_after(8) == "Call finish."
    with pytest.raises(ValueError, match="done=0"):
        CHORE.summary_after(0)


def _play(task, tmp_path: Path, writes: dict[str, str]) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(task.environment_dir, ws)
    for path, content in writes.items():
        Workspace(ws).write_file(path, content)
    return ws


@pytest.mark.anyio
async def test_partial_credit_per_file(tmp_path: Path) -> None:
    task = load_suite(SUITE)[0]
    solution = load_solution(task)
    writes = {
        s.arguments["path"]: s.arguments["content"] for s in solution.main if s.tool == "write_file"
    }
    for steps in solution.sub_agents.values():
        writes.update({s.arguments["path"]: s.arguments["content"] for s in steps})
    assert len(writes) == NOTES
    full = await verify(task, _play(task, tmp_path / "full", writes))
    assert (full.passed, full.total, full.score) == (4, 4, 1.0)
    # half the files right, one with the teacher's slip (a full stop), one missing: 2 of 4
    (p0, w0), (p1, w1), (p2, w2), _ = writes.items()
    half = await verify(task, _play(task, tmp_path / "half", {p0: w0, p1: f"{w1}.", p2: w2}))
    assert (half.passed, half.total, half.score) == (2, 4, 0.5)
    assert (await verify(task, _play(task, tmp_path / "none", {}))).score == 0.0


def test_main_job_config_trains_on_the_suite() -> None:
    from gyre.model.demonstrations import chain_conversations, encode_conversation
    from gyre.model.recipe import build_tokenizer

    config = load_config(ROOT / "examples" / "cpu.toml")
    assert config.tasks.suites == ("examples/tasks/learnable-long",)
    assert config.cells.num_cells == 2 and config.scheduler.policy == "elastic"
    assert config.warm_start.suite == "learnable-long"
    command = list(config.tasks.harness.agent_command)
    assert int(command[command.index("--compact-chars") + 1]) == COMPACT_CHARS
    max_tokens = int(command[command.index("--max-tokens") + 1])
    # the longest prompt of a perfect execution plus a reply fits the engine's context
    tokenizer = build_tokenizer()
    longest = 0
    for chore in learnable_long_chores(0):
        for conv in chain_conversations(chore):
            longest = max(
                longest, len(encode_conversation(tokenizer, conv["messages"], conv["tools"]).ids)
            )
    assert longest + max_tokens <= config.engine.max_model_len
    assert longest > 776  # system prompt and tools alone


def test_words_and_files_are_one_token_where_the_agent_copies_them() -> None:
    """A note quotes its word and file as the `write_file` call's JSON does, and each word and
    file stem is one token of the tiny tokenizer in both, so the token to copy is the same."""
    import json

    from gyre.model.recipe import build_tokenizer

    tok = build_tokenizer()
    for word, path in zip(WORDS, FILES * 2):
        chore = LongChore(words=(word,) * NOTES, files=(path,) * NOTES, delegated=0)
        note = tok.encode(chore.note(1), add_special_tokens=False)
        call = tok.encode(json.dumps({"path": path, "content": word}), add_special_tokens=False)
        for text in (word, path.removesuffix(".txt")):
            [token] = tok.encode(text, add_special_tokens=False)
            assert token in note and token in call, (text, tok.convert_ids_to_tokens(note))
