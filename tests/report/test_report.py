"""The run report: summary numbers computed by hand from a synthetic metrics file; valid PNGs;
with a recorded timeline, the Gantt PNG and utilisation per step equal to hand-computed values."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gyre.report import PLOTS, TIMELINE_PLOT, summarize, write_report
from gyre.report.__main__ import main
from gyre.runtime.metrics import EvalMetrics, MetricsWriter, StepMetrics, read_metrics
from tests.runtime.test_timeline import write_two_steps

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def step(
    n: int,
    *,
    pass_rate: float,
    partial: int = 0,
    failed: int = 0,
    tokens: int = 100,
    dedup: float = 1.5,
    diff: float = 1e-6,
    applied: bool = True,
    rollout: float = 10.0,
    train: float = 4.0,
    sync: float = 1.0,
) -> StepMetrics:
    return StepMetrics(
        step=n,
        version=n,
        executions=8,
        pass_rate=pass_rate,
        mean_reward=pass_rate + 0.1,
        finished=8 - partial - failed,
        partial=partial,
        failed=failed,
        truncated=0,
        model_calls=16,
        policy_tokens=tokens,
        packed_tokens=tokens * 2,
        dedup_ratio=dedup,
        logprob_abs_diff_mean=diff,
        mean_ratio=1.0,
        applied=applied,
        rollout_s=rollout,
        train_s=train,
        sync_s=sync,
        step_s=rollout + train + sync + 0.5,
    )


def heldout(n: int, pass_rate: float, split: str = "heldout") -> EvalMetrics:
    return EvalMetrics(
        step=n,
        version=n,
        split=split,
        executions=16,
        pass_rate=pass_rate,
        mean_reward=pass_rate,
        eval_s=6.0,
    )


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    w = MetricsWriter(tmp_path)
    w.write(heldout(0, 0.25))
    w.write(heldout(0, 0.5, split="train"))
    w.write(step(1, pass_rate=0.25, partial=1, tokens=100, dedup=1.0, diff=2e-6))
    w.write(
        step(2, pass_rate=0.5, failed=2, tokens=999, dedup=9.0)
    )  # superseded: run killed and resumed
    w.write(step(2, pass_rate=0.625, failed=1, tokens=200, dedup=2.0, diff=4e-6, applied=False))
    w.write(heldout(2, 0.625))
    w.write(step(3, pass_rate=0.625, partial=2, tokens=300, dedup=3.0, diff=6e-6))
    w.write(heldout(3, 0.5))
    return tmp_path


def test_summary_numbers_by_hand(run_dir: Path) -> None:
    s = summarize(read_metrics(run_dir))
    assert (s.steps, s.first_step, s.last_step) == (3, 1, 3)
    # 3 steps x (10 + 4 + 1 + 0.5) s + 4 evals x 6 s = 70.5 s: rollout 30 / 70.5 = 43%
    assert s.wall_s == pytest.approx(3 * 15.5 + 4 * 6.0)
    assert (s.rollout_s, s.train_s, s.sync_s) == (30.0, 12.0, 3.0)
    assert (s.executions, s.partial, s.failed, s.finished) == (24, 3, 1, 24 - 3 - 1)
    assert s.policy_tokens == 100 + 200 + 300
    assert s.mean_dedup_ratio == pytest.approx((1.0 + 2.0 + 3.0) / 3)
    assert s.mean_logprob_abs_diff == pytest.approx(
        4e-6
    ) and s.max_logprob_abs_diff == pytest.approx(6e-6)
    assert s.skipped_steps == 1
    assert s.eval_split == "heldout"
    assert (s.pass_before, s.pass_before_step, s.pass_after, s.pass_after_step) == (0.25, 0, 0.5, 3)
    assert (s.best_eval_pass, s.best_eval_step) == (0.625, 2)
    assert (s.best_step, s.best_step_pass) == (2, 0.625)  # ties go to the earliest step


def test_report_files(run_dir: Path) -> None:
    summary = write_report(run_dir)
    assert summary == run_dir / "report" / "summary.md"
    text = summary.read_text()
    for expected in (
        "| steps | 3 (1-3) |",
        "| pass rate before (heldout) | 25.0% at step 0 |",
        "| pass rate after (heldout) | 50.0% at step 3 |",
        "| change | +25.0 points |",
        "| best evaluation (heldout) | 62.5% at step 2 |",
        "| best step (batch pass rate) | 2 (62.5%) |",
        "| training executions | 24 (finished 20, partially scored 3, failed 1) |",
        "| policy tokens trained | 600 |",
        "| mean dedup ratio of training batches (selected paths / packed tokens) | 2.00x |",
        "| time in steps + evaluations | 1m 10s "
        "(rollout 43%, train 17%, sync 4%, evaluation 34%) |",
    ):
        assert expected in text, expected
    for name in PLOTS:
        data = (run_dir / "report" / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000
        assert f"]({name})" in text


def test_empty_run_and_missing_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nothing")]) == 2
    assert "no metrics" in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").write_text("")
    s = summarize([])
    assert s.steps == 0 and s.pass_before is None and math.isnan(s.mean_dedup_ratio)
    assert main([str(tmp_path)]) == 0
    assert "| steps | 0 |" in (tmp_path / "report" / "summary.md").read_text()
    only_before = summarize(
        [
            EvalMetrics(
                step=0,
                version=0,
                split="heldout",
                executions=4,
                pass_rate=0.5,
                mean_reward=0.5,
                eval_s=1.0,
            )
        ]
    )
    assert (only_before.pass_before, only_before.pass_after) == (0.5, None)  # no "after" yet
    assert all((tmp_path / "report" / n).read_bytes().startswith(PNG_MAGIC) for n in PLOTS)


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"type": "eval", "step": 0}\n\n{"type": "eval"}\n')
    assert main([str(tmp_path / "metrics.jsonl")]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith("not a run directory (give the folder that holds metrics.jsonl)")
    )
    assert main([str(tmp_path)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {tmp_path / 'metrics.jsonl'}:1: not a metrics record (")
    assert not (tmp_path / "report").exists()


def test_report_with_a_timeline(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert not (
        write_report(run_dir).parent / TIMELINE_PLOT
    ).exists()  # no timeline: no Gantt chart
    write_two_steps(run_dir)  # the hand-computed timeline of tests/runtime/test_timeline.py
    assert main([str(run_dir)]) == 0
    assert "and 4 plots" in capsys.readouterr().out
    text = (run_dir / "report" / "summary.md").read_text()
    # busy = busy cell-s / (2 cells x window); slot fill = level integral / capacity integral
    for expected in (
        "| step | window (s) | busy | slot fill | rollout (cell-s) | train (cell-s) "
        "| step (cell-s) | load (cell-s) | switch (cell-s) | idle (cell-s) |",
        "| 1 | 0.0-10.0 | 95.0% | 78.6% | 14.0 | 3.0 | 2.0 | 1.0 | 1.0 | 0.0 |",  # 19/20, 22/28
        "| 2 | 10.0-14.0 | 62.5% | 12.5% | 1.0 | 2.0 | 2.0 | 0.0 | 0.0 | 3.0 |",  # 5/8, 1/8
        "| all | 0.0-14.0 | 85.7% | 63.9% | 15.0 | 5.0 | 4.0 | 1.0 | 1.0 | 3.0 |",  # 24/28, 23/36
        f"![cell timeline]({TIMELINE_PLOT})",
    ):
        assert expected in text, expected
    assert "| steps | 3 (1-3) |" in text  # the metrics part is unchanged
    data = (run_dir / "report" / TIMELINE_PLOT).read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000


def test_a_step_whose_executions_all_failed_reads_back_as_nan(tmp_path: Path) -> None:
    """JSON has no NaN (the writer emits null): a batch or evaluation with every execution failed
    has no pass rate, and reading it back must neither crash the run nor invent a number (the
    fresh-clone `make run` whose verifier could not start died here)."""
    nan = math.nan
    w = MetricsWriter(tmp_path)
    w.write(
        EvalMetrics(
            step=0,
            version=0,
            split="heldout",
            executions=16,
            pass_rate=nan,
            mean_reward=nan,
            eval_s=6.0,
        )
    )
    w.write(
        StepMetrics(
            step=1,
            version=0,
            executions=8,
            pass_rate=nan,
            mean_reward=nan,
            finished=0,
            partial=0,
            failed=8,
            truncated=0,
            model_calls=16,
            policy_tokens=0,
            packed_tokens=0,
            dedup_ratio=nan,
            logprob_abs_diff_mean=nan,
            mean_ratio=nan,
            applied=False,
            rollout_s=10.0,
            train_s=0.0,
            sync_s=0.0,
            step_s=10.5,
        )
    )
    w.write(step(2, pass_rate=0.5))
    assert b"null" in (tmp_path / "metrics.jsonl").read_bytes()
    evaluation, failed, fine = read_metrics(tmp_path)
    assert math.isnan(evaluation.pass_rate) and math.isnan(evaluation.mean_reward)
    assert (failed.failed, failed.applied, failed.policy_tokens) == (8, False, 0)
    assert all(
        math.isnan(x)
        for x in (failed.pass_rate, failed.mean_reward, failed.dedup_ratio, failed.mean_ratio)
    )
    assert (fine.step, fine.pass_rate, fine.mean_reward) == (2, 0.5, 0.6)
    assert write_report(tmp_path).exists()


def test_the_mismatch_is_split_into_numerics_and_stale_drift(tmp_path: Path) -> None:
    """The summary shows the worst step's same-version mismatch (numerics) beside the stale one
    (off-policy drift); records without the split (NaN) count as absent."""
    import msgspec

    with MetricsWriter(tmp_path) as w:
        w.write(step(1, pass_rate=0.5))  # no split recorded: NaN, NaN
        for n, same, stale in ((2, 3e-7, 2e-3), (3, 1e-7, 5e-3)):
            w.write(
                msgspec.structs.replace(
                    step(n, pass_rate=0.5),
                    same_version_mismatch_mean=same,
                    stale_mismatch_mean=stale,
                )
            )
    s = summarize(read_metrics(tmp_path))
    assert (s.max_same_version_mismatch, s.max_stale_mismatch) == (3e-7, 5e-3)
    page = write_report(tmp_path).read_text()
    assert (
        "| worst step's mismatch: same weight version (numerics) / stale tokens (drift) | "
        "3.00e-07 nats / 5.00e-03 nats |" in page
    )
