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
