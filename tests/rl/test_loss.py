"""Policy loss: hand-computed PPO terms, B09 masking by selection, statistics."""

from __future__ import annotations

import math

import pytest
import torch

from gyre.rl import masked_token_mean, policy_loss


@pytest.mark.parametrize("filler", [40.0, float("nan"), float("inf"), float("-inf")])
def test_b09_token_mean_ignores_masked_values_and_gives_them_zero_gradient(filler):
    loss = torch.tensor([[2.0, 40.0], [4.0, -30.0]], requires_grad=True)
    with torch.no_grad():
        loss[:, 1] = torch.tensor([filler, -filler if not math.isnan(filler) else filler])
    mask = torch.tensor([[True, False], [True, False]])
    mean = masked_token_mean(loss, mask)
    assert mean.item() == 3.0  # (2 + 4) / 2, not the buggy 8.0
    mean.backward()
    assert loss.grad.tolist() == [[0.5, 0.0], [0.5, 0.0]]


def test_b09_buggy_value_is_what_multiplying_would_give():
    loss = torch.tensor([[2.0, 40.0], [4.0, -30.0]])
    assert loss.sum().item() / 2 == 8.0  # the bug B09 describes: unmasked sum / valid count
    assert masked_token_mean(loss, torch.tensor([[True, False], [True, False]])).item() == 3.0


def test_masked_token_mean_of_nothing_is_zero_not_nan():
    assert masked_token_mean(torch.tensor([float("nan")]), torch.tensor([False])).item() == 0.0


def _one(lp, blp, adv, *, clip_eps=0.2, is_cap=2.0):
    lp_t = torch.tensor([lp], dtype=torch.float64, requires_grad=True)
    f64 = torch.float64
    loss, stats = policy_loss(
        lp_t,
        torch.tensor([blp], dtype=f64),
        torch.tensor([adv], dtype=f64),
        torch.tensor([1.0], dtype=torch.float64),
        torch.tensor([True]),
        clip_eps=clip_eps,
        is_cap=is_cap,
    )
    loss.backward()
    return loss.item(), lp_t.grad.item(), stats


def test_ppo_terms_by_hand():
    # ratio 1: term = -A, d term / d lp = -A * ratio
    loss, grad, stats = _one(-1.0, -1.0, 0.5)
    assert loss == pytest.approx(-0.5) and grad == pytest.approx(-0.5)
    assert stats.clip_fraction == 0.0 and stats.mean_ratio == pytest.approx(1.0)
    # ratio 1.5, A = +1: clipped at 1.2, no gradient
    loss, grad, stats = _one(math.log(1.5), 0.0, 1.0)
    assert loss == pytest.approx(-1.2) and grad == 0.0 and stats.clip_fraction == 1.0
    # ratio 1.1 inside the range, A = -2: term = 2.2, gradient 2 * 1.1
    loss, grad, _ = _one(math.log(1.1), 0.0, -2.0)
    assert loss == pytest.approx(2.2) and grad == pytest.approx(2.2)
    # ratio 3 over the IS cap 2, A = -1: term = cap * 1 = 2, no gradient (dual clip)
    loss, grad, stats = _one(math.log(3.0), 0.0, -1.0)
    assert loss == pytest.approx(2.0) and grad == 0.0 and stats.is_capped_fraction == 1.0
    # ratio 0.5, A = -1: clipped at 0.8 -> term = 0.8, no gradient
    loss, grad, _ = _one(math.log(0.5), 0.0, -1.0)
    assert loss == pytest.approx(0.8) and grad == 0.0


def test_weighted_sum_and_masked_nan_stay_out():
    lp = torch.tensor([-1.0, float("nan"), -2.0], dtype=torch.float64, requires_grad=True)
    blp = torch.tensor([-1.0, float("-inf"), -2.0], dtype=torch.float64)
    adv = torch.tensor([1.0, float("nan"), -1.0], dtype=torch.float64)
    w = torch.tensor([0.25, float("inf"), 0.5], dtype=torch.float64)
    mask = torch.tensor([True, False, True])
    loss, stats = policy_loss(lp, blp, adv, w, mask)
    loss.backward()
    assert loss.item() == pytest.approx(-0.25 + 0.5)
    assert lp.grad.tolist() == [-0.25, 0.0, 0.5]
    assert (stats.tokens, stats.masked_tokens, stats.mean_abs_logprob_diff) == (2, 1, 0.0)


def test_bad_arguments():
    x = torch.zeros(2)
    m = torch.ones(2, dtype=torch.bool)
    with pytest.raises(ValueError, match="advantage_N has shape"):
        policy_loss(x, x, torch.zeros(3), x, m)
    with pytest.raises(ValueError, match="clip_eps=1.5"):
        policy_loss(x, x, x, x, m, clip_eps=1.5)
    with pytest.raises(ValueError, match="is_cap=1.1"):
        policy_loss(x, x, x, x, m, is_cap=1.1)
    with pytest.raises(ValueError, match="mask_N must be bool"):
        policy_loss(x, x, x, x, torch.ones(2))


def test_same_version_mismatch_is_reported_apart_from_stale_drift():
    """Four loss tokens (the fifth masked): |lp - blp| = 0.1, 0.2 sampled by the trainer's own
    version, 0.5, 1.0 by older ones. Same-version mean 0.15 (numerics), all 0.45; the stale part
    (0.75) is what `mismatch_split` derives from the sums."""
    from gyre.engines.protocol import AccumulateStatistics, mismatch_split

    lp = torch.tensor([-1.0, -1.0, -1.0, -1.0, -1.0], dtype=torch.float64)
    blp = torch.tensor([-1.1, -0.8, -1.5, -2.0, -9.0], dtype=torch.float64)
    ones = torch.ones(5, dtype=torch.float64)
    mask = torch.tensor([True, True, True, True, False])
    same = torch.tensor([True, True, False, False, True])
    _, stats = policy_loss(lp, blp, ones, ones, mask, same_version_N=same)
    assert stats.tokens == 4 and stats.same_version_tokens == 2
    assert math.isclose(stats.mean_abs_logprob_diff, 0.45)
    assert math.isclose(stats.same_version_abs_logprob_diff, 0.15)
    _, none = policy_loss(lp, blp, ones, ones, mask)
    assert none.same_version_tokens == 0 and math.isnan(none.same_version_abs_logprob_diff)

    def acc(total, counted, same_sum, same_counted):
        return AccumulateStatistics(
            micro_batches=1,
            tokens=counted,
            policy_tokens=counted,
            loss=0.0,
            logprob_abs_diff_sum=total,
            ratio_sum=float(counted),
            counted=counted,
            same_version_abs_diff_sum=same_sum,
            same_version_counted=same_counted,
            finite=True,
        )

    split = mismatch_split([acc(1.8, 4, 0.3, 2), acc(0.4, 2, 0.4, 2)])
    assert math.isclose(split["same_version_abs_diff_mean"], 0.7 / 4)
    assert math.isclose(split["stale_abs_diff_mean"], 1.5 / 2)
    only_same = mismatch_split([acc(0.4, 2, 0.4, 2)])
    assert math.isnan(only_same["stale_abs_diff_mean"])
