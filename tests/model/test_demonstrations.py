"""`python -m gyre.model demos`: demonstration conversations of a suite and fresh examples, as
JSON lines."""

from __future__ import annotations

import json
from pathlib import Path

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

    # the history passes 600 characters (history_chars) once note2 is read: the first main
    # segment, the summary (note2's text: its chore is pending), the main conversation restarted
    # from the summary, which delegates, and last the sub-agent it ran
    first, summary, second, sub = chain_conversations(chore, slip=True)
    assert calls(first["messages"]) == [
        ("read_file", {"path": "note0.txt"}),
        ("write_file", {"path": "a.txt", "content": "apple."}),
        ("read_file", {"path": "note1.txt"}),
        ("write_file", {"path": "b.txt", "content": "river."}),
        ("read_file", {"path": "note2.txt"}),
    ]
    assert first["messages"][3]["content"] == chore.note(0)  # the real tool result
    assert first["messages"][5]["content"] == "wrote 6 characters to a.txt"
    assert first["messages"][-1]["content"] == chore.note(2)
    assert first["tools"] == TOOL_SCHEMAS
    assert summary["tools"] is None and summary["loss"] == "last"
    assert summary["messages"][:-2] == first["messages"]
    assert summary["messages"][-2:] == [
        {"role": "user", "content": COMPACT_PROMPT},
        {"role": "assistant", "content": chore.note(2)},
    ]
    assert second["messages"][1]["content"] == (
        f"{INSTRUCTION}\n\nProgress so far:\n{chore.note(2)}"
    )
    assert calls(second["messages"]) == [
        ("delegate", {"task": 'Write the word "stone" to the file "x.txt".'}),
        ("read_file", {"path": "note3.txt"}),
        ("write_file", {"path": "out.txt", "content": "cloud."}),
        ("finish", {"summary": FINISH_SUMMARY}),
    ]
    assert second["messages"][3]["content"] == FINISH_SUMMARY  # the sub-agent's summary
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
    assert len(summaries) == 10  # one compaction per chain
    enc = encode_conversation(tokenizer, summaries[0]["messages"], None, last_only=True)
    answer = summaries[0]["messages"][-1]["content"] + tokenizer.eos_token
    loss_ids = [i for i, m in zip(enc.ids, enc.loss_mask) if m]
    assert loss_ids == tokenizer.encode(answer, add_special_tokens=False)
    # 4 conversations per chain (2 main segments, the summary, the sub-agent); half slip
    assert len(demos) == 40
    slipped = [
        d
        for d in demos
        if d["tools"] is not None
        and any(
            '."}' in c["function"]["arguments"]
            for m in d["messages"]
            for c in m.get("tool_calls") or []
        )
    ]
    assert 0 < len(slipped) < 30
