"""`python -m gyre.model demos`: demonstration conversations of a suite and fresh examples, as
JSON lines."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gyre.model.__main__ import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


def test_demos_cli(tmp_path: Path) -> None:
    out = tmp_path / "demos.jsonl"
    assert (
        main(
            [
                "demos",
                "--out",
                str(out),
                "--suite-dir",
                str(EXAMPLES / "learnable"),
                "--count",
                "10",
            ]
        )
        == 0
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 32 + 10
    assert all(d["messages"][-1]["tool_calls"][0]["function"]["name"] == "finish" for d in lines)


def test_chain_conversations_are_the_agents_turns() -> None:
    from gyre.agents.oracle import FINISH_SUMMARY
    from gyre.agents.react import COMPACT_PROMPT
    from gyre.agents.tools import SUB_AGENT_PROMPT, SUB_AGENT_TOOL_SCHEMAS, TOOL_SCHEMAS
    from gyre.model.demonstrations import chain_conversations
    from gyre.tasks.suites.learnable_long import INSTRUCTION, LongChore

    chore = LongChore(
        words=("apple", "river", "stone", "cloud"),
        files=("a.txt", "b.txt", "x.txt", "out.txt"),
        delegated=2,
    )

    def calls(messages: list[dict]) -> list[tuple[str, dict]]:
        return [
            (c["function"]["name"], json.loads(c["function"]["arguments"]))
            for m in messages
            if m["role"] == "assistant" and m.get("tool_calls")
            for c in m["tool_calls"]
        ]

    # the history passes 400 characters (history_chars) right after note1, note2 and note3 are
    # read, each chore still pending: 4 main segments, each of the first 3 followed by its
    # summary (the note's text); the sub-agent follows the segment that delegated
    seg1, sum1, seg2, sum2, seg3, sub, sum3, seg4 = chain_conversations(chore, slip=True)
    assert calls(seg1["messages"]) == [
        ("read_file", {"path": "note0.txt"}),
        ("write_file", {"path": "a.txt", "content": "apple."}),
        ("read_file", {"path": "note1.txt"}),
    ]
    assert seg1["messages"][3]["content"] == chore.note(0)  # the real tool result
    assert seg1["messages"][5]["content"] == "wrote 6 characters to a.txt"
    assert seg1["tools"] == TOOL_SCHEMAS
    for segment, summary, note in ((seg1, sum1, 1), (seg2, sum2, 2), (seg3, sum3, 3)):
        assert segment["messages"][-1] == {
            "role": "tool",
            "tool_call_id": f"call_{2 * note}",
            "content": chore.note(note),
        }
        assert summary["tools"] is None and summary["loss"] == "last"
        assert summary["messages"][:-2] == segment["messages"]
        assert summary["messages"][-2:] == [
            {"role": "user", "content": COMPACT_PROMPT},
            {"role": "assistant", "content": chore.note(note)},
        ]
    for segment, note in ((seg2, 1), (seg3, 2), (seg4, 3)):
        assert segment["messages"][1]["content"] == (
            f"{INSTRUCTION}\n\nProgress so far:\n{chore.note(note)}"
        )
    assert calls(seg2["messages"]) == [
        ("write_file", {"path": "b.txt", "content": "river."}),
        ("read_file", {"path": "note2.txt"}),
    ]
    assert calls(seg3["messages"]) == [
        ("delegate", {"task": 'Write the word "stone" to the file "x.txt".'}),
        ("read_file", {"path": "note3.txt"}),
    ]
    assert seg3["messages"][3]["content"] == FINISH_SUMMARY  # the sub-agent's summary
    assert calls(seg4["messages"]) == [
        ("write_file", {"path": "out.txt", "content": "cloud."}),
        ("finish", {"summary": FINISH_SUMMARY}),
    ]
    assert sub["tools"] == SUB_AGENT_TOOL_SCHEMAS
    assert sub["messages"][:2] == [
        {"role": "system", "content": SUB_AGENT_PROMPT},
        {"role": "user", "content": 'Write the word "stone" to the file "x.txt".'},
    ]
    assert calls(sub["messages"]) == [
        ("write_file", {"path": "x.txt", "content": "stone."}),
        ("finish", {"summary": FINISH_SUMMARY}),
    ]
    # without the slip the words are exact; a larger threshold means no compaction
    assert calls(chain_conversations(chore)[0]["messages"])[1][1]["content"] == "apple"
    assert len(chain_conversations(chore, compact_chars=10**6)) == 2  # main and sub-agent


def test_chain_summary_carries_loss_on_its_answer_only() -> None:
    from gyre.config import WarmStartConfig
    from gyre.model.demonstrations import demonstrations, encode_conversation
    from gyre.model.recipe import build_tokenizer

    tokenizer = build_tokenizer()
    demos = demonstrations(WarmStartConfig(suite="learnable-long", examples=10, slip_fraction=0.5))
    assert demos == demonstrations(
        WarmStartConfig(suite="learnable-long", examples=10, slip_fraction=0.5)
    )
    summaries = [d for d in demos if d.get("loss") == "last"]
    assert len(summaries) == 30  # three compactions per chain
    enc = encode_conversation(tokenizer, summaries[0]["messages"], None, last_only=True)
    answer = summaries[0]["messages"][-1]["content"] + tokenizer.eos_token
    loss_ids = [i for i, m in zip(enc.ids, enc.loss_mask) if m]
    assert loss_ids == tokenizer.encode(answer, add_special_tokens=False)
    # 8 conversations per chain (4 main segments, 3 summaries, the sub-agent); a chain slips
    # where its draw from random.Random("slip") is below slip_fraction, and then every word it
    # writes ends in a full stop
    assert len(demos) == 80
    draws = random.Random("slip")
    chain_slips = [draws.random() < 0.5 for _ in range(10)]
    assert True in chain_slips and False in chain_slips
    written = 0
    for j, d in enumerate(demos):
        writes = [
            json.loads(c["function"]["arguments"])["content"]
            for m in d["messages"]
            for c in m.get("tool_calls") or []
            if c["function"]["name"] == "write_file"
        ]
        assert all(w.endswith(".") == chain_slips[j // 8] for w in writes), (j, writes)
        written += len(writes)
    assert written >= 4 * 10  # each chain writes its 4 files (summaries repeat some)


@pytest.mark.parametrize("slip", [False, True])
def test_every_chain_compacts_after_reading_note1_to_note3(slip: bool) -> None:
    """COMPACT_CHARS' documented margin: on 600 drawn chains, with or without the slip, a perfect
    main history is compacted COMPACTIONS times at any limit from 380 to 420, each right after a
    note is read, so every summary is that note's text (its chore pending); at 600, once."""
    from gyre.model.demonstrations import chain_conversations
    from gyre.tasks.suites.learnable_long import COMPACT_CHARS, COMPACTIONS, learnable_long_examples

    def summaries(chore, limit: int) -> list[str]:
        conversations = chain_conversations(chore, slip=slip, compact_chars=limit)
        return [d["messages"][-1]["content"] for d in conversations if d.get("loss") == "last"]

    assert 380 <= COMPACT_CHARS <= 420
    for chore in learnable_long_examples(600, 7):
        notes = [chore.note(i) for i in range(1, 1 + COMPACTIONS)]
        for limit in (380, COMPACT_CHARS, 420):
            assert summaries(chore, limit) == notes, (chore, limit)
        assert len(summaries(chore, 600)) == 1
