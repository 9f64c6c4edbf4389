"""The static report's trajectory-tree statistics and per-step table: a hand-built call log whose
trees are counted by hand (tokens, unique tokens, branches, branch points, depth, dedup ratio,
the compaction that branches one of them), and steps whose branches, heals and suspensions the
page lists.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from gyre.report.page import SUSPENSIONS_NOTE, TREES_CSV, write_report
from gyre.report.summary import summarize
from gyre.report.trees import execution_trees, tree_totals
from gyre.runtime.metrics import MetricsWriter, read_metrics
from gyre.tito.log import CallEntry, encode_frame
from gyre.tito.records import Divergence, FullCall, to_reference
from tests.report.test_report import step


def call(execution: str, call_id: str, prompt: list[int], completion: list[int], **kw) -> FullCall:
    n = len(completion)
    return FullCall(
        execution_id=execution,
        call_id=call_id,
        role="main",
        prompt_ids=prompt,
        completion_ids=completion,
        logprobs=[-0.5] * n,
        versions=[0] * n,
        finish_reason="stop",
        **kw,
    )


def write_log(run_dir: Path) -> None:
    """Execution `a`: c2 extends c1; c3 compacts the history after token 2 (a branch).
    Execution `b`: one call."""
    calls = [
        call("a", "c1", [1, 2, 3], [4, 5]),
        call("b", "c1", [1], [2]),
        call("a", "c2", [1, 2, 3, 4, 5, 6], [7], parent_call_id="c1"),
        call(
            "a",
            "c3",
            [1, 2, 9],
            [10, 11],
            parent_call_id="c2",
            divergence=Divergence(parent_call_id="c2", index=2, reason="compaction"),
        ),
    ]
    run_dir.mkdir(parents=True, exist_ok=True)
    refs = [*to_reference(c for c in calls if c.execution_id == "a"), *to_reference(calls[1:2])]
    (run_dir / "calls.log").write_bytes(b"".join(encode_frame(CallEntry(call=c)) for c in refs))


def test_tree_statistics_by_hand(tmp_path: Path) -> None:
    write_log(tmp_path)
    a, b = execution_trees(tmp_path)
    # a: nodes 1 2 3 4 5 6 7 and 9 10 11 under 2; calls hold 5 + 7 + 5 tokens
    assert (a.execution_id, a.calls, a.tokens_in_calls, a.unique_tokens) == ("a", 3, 17, 10)
    assert (a.policy_tokens, a.branches, a.branch_points, a.depth) == (5, 2, 1, 7)
    assert a.dedup_ratio == 17 / 10 and a.divergences == {"compaction": 1}
    assert (b.calls, b.tokens_in_calls, b.unique_tokens, b.branches, b.depth) == (1, 2, 2, 1, 2)
    t = tree_totals([a, b])
    assert (t.executions, t.calls, t.tokens_in_calls, t.unique_tokens) == (2, 4, 19, 12)
    assert (t.branches, t.branch_points, t.branches_max, t.depth_max) == (3, 1, 2, 7)
    assert t.dedup_ratio == 19 / 12
    assert t.dedup_ratio_median == (1.7 + 1.0) / 2 and t.dedup_ratio_max == 1.7
    assert t.branches_median == 1.5 and t.divergences == {"compaction": 1}
    empty = tree_totals([])
    assert empty.executions == 0 and math.isnan(empty.dedup_ratio)


def test_report_lists_trees_and_branches_heals_suspensions_per_step(tmp_path: Path) -> None:
    write_log(tmp_path)
    with MetricsWriter(tmp_path) as w:
        w.write(step(1, pass_rate=0.25))  # written before branches were counted: -1
    with open(tmp_path / "metrics.jsonl", "a") as f:  # a record with the count
        f.write(
            '{"type":"step","step":2,"version":2,"executions":8,"pass_rate":0.5,'
            '"mean_reward":0.5,"finished":8,"partial":0,"failed":0,"truncated":0,'
            '"model_calls":16,"branches":11,"heals":3,"suspensions":2,"policy_tokens":100,'
            '"packed_tokens":200,'
            '"dedup_ratio":1.5,"logprob_abs_diff_mean":1e-06,"mean_ratio":1.0,"applied":true,'
            '"rollout_s":10.0,"train_s":4.0,"sync_s":1.0,"step_s":15.5}\n'
        )
    records = read_metrics(tmp_path)
    assert [r.branches for r in records] == [-1, 11]
    assert summarize(records).branches is None  # a step predates the count
    assert summarize(records[1:]).branches == 11
    page = write_report(tmp_path).read_text()
    assert "| 1 | 8 | 25.0% | 16 | n/a | n/a | n/a |" in page
    assert "| 2 | 8 | 50.0% | 16 | 11 | 3 | 2 |" in page
    assert SUSPENSIONS_NOTE in page and "healing is not built" not in page
    assert "| trajectories (tree leaves) of trained executions | n/a |" in page
    assert "## Trajectory trees" in page
    assert "| tokens in calls / unique tokens | 19 / 12 |" in page
    assert "| dedup ratio of calls (tokens in calls / unique tokens) | 1.58x |" in page
    assert "| dedup ratio per execution (median / max) | 1.35x / 1.70x |" in page
    assert "| branches per execution (median / max) | 1.5 / 2 |" in page
    assert "| rewritten-history calls by reason | compaction 1 |" in page
    assert "| `a` | 3 | 17 | 10 | 1.70x | 2 | 1 | 7 | compaction 1 |" in page
    assert "| `b` | 1 | 2 | 2 | 1.00x | 1 | 0 | 2 | none |" in page
    assert page.index("| `a` |") < page.index("| `b` |")  # most tokens first
    with open(tmp_path / "report" / TREES_CSV) as f:
        rows = list(csv.DictReader(f))
    assert [r["execution_id"] for r in rows] == ["a", "b"]
    assert float(rows[0]["dedup_ratio"]) == 1.7 and rows[0]["branches"] == "2"
    assert rows[1]["divergences"] == "none"


def test_report_without_a_call_log_has_no_tree_section(tmp_path: Path) -> None:
    with MetricsWriter(tmp_path) as w:
        w.write(step(1, pass_rate=0.25))
    page = write_report(tmp_path).read_text()
    assert "## Steps" in page and "## Trajectory trees" not in page
    assert not (tmp_path / "report" / TREES_CSV).exists()


@pytest.mark.parametrize("name", ["calls.log", "other.log"])
def test_the_call_log_name_is_configurable(tmp_path: Path, name: str) -> None:
    write_log(tmp_path)
    (tmp_path / "calls.log").rename(tmp_path / name)
    with MetricsWriter(tmp_path) as w:
        w.write(step(1, pass_rate=0.25))
    page = write_report(tmp_path, log_name=name).read_text()
    assert "| tokens in calls / unique tokens | 19 / 12 |" in page
