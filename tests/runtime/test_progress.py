"""Live progress: plain one-line-per-event output off a terminal; the rich table renders records."""

from __future__ import annotations

import io
import math

import pytest

from gyre.runtime.metrics import EvalMetrics, StepMetrics
from gyre.runtime.progress import Progress


def record(step: int, *, applied: bool = True, reward: float = 0.625) -> StepMetrics:
    return StepMetrics(
        step=step,
        version=step,
        executions=16,
        pass_rate=0.5,
        mean_reward=reward,
        finished=14,
        partial=1,
        failed=1,
        truncated=0,
        model_calls=40,
        policy_tokens=1234,
        packed_tokens=2000,
        dedup_ratio=1.75,
        logprob_abs_diff_mean=2.5e-6,
        mean_ratio=1.0,
        applied=applied,
        grad_norm=0.875 if applied else math.nan,
        rollout_s=30.25,
        train_s=10.0,
        sync_s=2.5,
        step_s=43.0,
    )


EVAL = EvalMetrics(
    step=0,
    version=0,
    split="heldout",
    executions=16,
    pass_rate=0.25,
    mean_reward=0.375,
    eval_s=12.0,
)


def test_plain_mode_prints_one_line_per_event() -> None:
    out = io.StringIO()  # not a terminal: plain mode is chosen automatically
    with Progress(total_steps=8, stream=out) as progress:
        assert not progress.live_mode
        progress.message("warm start: cached runs/model-sft")
        progress.eval(EVAL)
        progress.step(record(1))
        progress.step(record(2, applied=False, reward=math.nan))
    assert out.getvalue().splitlines() == [
        "warm start: cached runs/model-sft",
        "eval heldout at step 0  v0  pass 0.250  reward 0.375  (16 executions, 12.0s)",
        "step 1/8  v1  pass 0.500  reward 0.625  exec 16 (partial 1, failed 1)  "
        "tokens 1234  dedup 1.75  "
        "|dlogp| 2.5e-06  |g| 0.88  time 43.0s (rollout 30.2, train 10.0, sync 2.5)",
        "step 2/8  v2  pass 0.500  reward nan  exec 16 (partial 1, failed 1)  "
        "tokens 1234  dedup 1.75  "
        "|dlogp| 2.5e-06  |g| nan  time 43.0s (rollout 30.2, train 10.0, sync 2.5)  SKIPPED",
    ]


def test_live_table_shows_latest_rows_and_heldout_header() -> None:
    out = io.StringIO()
    progress = Progress(total_steps=20, stream=out, live=True, rows=3)
    progress.console.width = 160
    progress.eval(EVAL)
    for k in range(1, 6):
        progress.step(record(k))
    progress.eval(
        EvalMetrics(
            step=5,
            version=5,
            split="heldout",
            executions=16,
            pass_rate=0.5,
            mean_reward=0.5,
            eval_s=11.0,
        )
    )
    progress.close()
    progress.close()  # idempotent
    text = out.getvalue()
    assert "held-out pass 25.0% (step 0) -> 50.0% (step 5)" in text
    last_frame = text[text.rindex("gyre RL") :]
    assert (
        "5/20" in last_frame and "3/20" in last_frame and "2/20" not in last_frame
    )  # 3 newest rows


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="rows=0"):
        Progress(rows=0)
