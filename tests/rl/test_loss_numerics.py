"""Policy loss at extreme log-ratios: finite loss and gradients in float32 and bfloat16 (issue 18).

Hand-computed terms (is_cap 2, clip_eps 0.2, weight 1): above the cap a token's term is -1.2 * A
for A >= 0 (clipped) and -2 * A for A < 0 (capped), both with zero gradient; far below 1 it is
-r * A for A > 0 (gradient -r * A) and -0.8 * A for A < 0 (no gradient).
"""

from __future__ import annotations

import math

import pytest
import torch

from gyre.rl.loss import log_ratio_bound, policy_loss

DTYPES = [torch.float32, torch.bfloat16]
REL = {torch.float32: 1e-6, torch.bfloat16: 1e-2}


def unbounded(lp, blp, adv, *, clip_eps=0.2, is_cap=2.0):
    """The formula without the bound: what `policy_loss` computed before issue 18."""
    ratio = torch.exp(lp - blp)
    unclipped = torch.clamp(ratio, max=is_cap) * adv
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv
    return (-torch.minimum(unclipped, clipped)).sum()


def one(log_ratio: float, adv: float, dtype: torch.dtype, fn=None):
    """(loss, d loss / d logprob) of one token with logprob 0 and behaviour logprob -log_ratio."""
    lp = torch.zeros(1, dtype=dtype, requires_grad=True)
    blp = torch.tensor([-log_ratio], dtype=dtype)
    a = torch.tensor([adv], dtype=dtype)
    if fn is None:
        loss, _ = policy_loss(
            lp, blp, a, torch.ones(1, dtype=dtype), torch.ones(1, dtype=torch.bool)
        )
    else:
        loss = fn(lp, blp, a)
    loss.backward()
    return float(loss.detach()), float(lp.grad[0])


# (log-ratio, advantage, hand-computed term, hand-computed gradient)
CASES = [
    (1e4, 1.0, -1.2, 0.0),  # clipped at 1 + eps
    (1e4, -1.0, 2.0, 0.0),  # capped at is_cap
    (88.7, 1.0, -1.2, 0.0),  # exp(88.7) is finite in float32, barely
    (88.7, -3.0, 6.0, 0.0),
    (89.0, -1.0, 2.0, 0.0),  # exp(89) overflows in float32 and bfloat16
    (-1e4, 1.0, 0.0, 0.0),  # r = 0: -r * A = 0, gradient -r * A = 0
    (-1e4, -1.0, 0.8, 0.0),  # clipped at 1 - eps
    (-88.7, -1.0, 0.8, 0.0),
    (0.0, 0.5, -0.5, -0.5),  # in range: -r * A, gradient -r * A
    (math.log(1.1), -2.0, 2.2, 2.2),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("log_ratio", "adv", "term", "grad"), CASES)
def test_extreme_log_ratios_give_finite_hand_computed_loss_and_gradient(
    log_ratio, adv, term, grad, dtype
):
    loss, g = one(log_ratio, adv, dtype)
    assert math.isfinite(loss) and math.isfinite(g)
    assert loss == pytest.approx(term, rel=REL[dtype], abs=1e-30)
    assert g == pytest.approx(grad, rel=REL[dtype], abs=1e-30)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    ("log_ratio", "adv"), [(c[0], c[1]) for c in CASES] + [(-88.7, 1.0), (-80.0, 2.0)]
)
def test_bounded_equals_unbounded_wherever_the_unbounded_is_finite(log_ratio, adv, dtype):
    ref_loss, ref_grad = one(log_ratio, adv, dtype, fn=unbounded)
    loss, g = one(log_ratio, adv, dtype)
    if math.isfinite(ref_loss) and math.isfinite(ref_grad):
        assert (loss, g) == (ref_loss, ref_grad)  # bit for bit, tiny exp(-88.7) terms included
    else:
        assert math.isfinite(loss) and math.isfinite(g)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_unbounded_formula_was_nan_past_88(dtype):
    """The bug: exp(89) = inf, the ratio clamp's zero gradient times inf is NaN."""
    loss, g = one(89.0, 1.0, dtype, fn=unbounded)
    assert loss == pytest.approx(-1.2, rel=REL[dtype]) and math.isnan(g)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_one_extreme_token_leaves_the_other_gradients_as_they_were(dtype):
    lp = torch.tensor([-1.0, 0.0, -2.0], dtype=dtype, requires_grad=True)
    blp = torch.tensor([-1.0, -1e4, -2.0], dtype=dtype)
    adv = torch.tensor([1.0, 1.0, -1.0], dtype=dtype)
    w = torch.tensor([0.25, 0.5, 0.5], dtype=dtype)
    loss, stats = policy_loss(lp, blp, adv, w, torch.ones(3, dtype=torch.bool))
    loss.backward()
    # -0.25 * 1 (ratio 1) + 0.5 * -1.2 (clipped) + 0.5 * 1 (ratio 1, A = -1)
    assert float(loss.detach()) == pytest.approx(-0.25 - 0.6 + 0.5, rel=REL[dtype])
    assert [float(x) for x in lp.grad] == [-0.25, 0.0, 0.5]
    assert stats.is_capped_fraction == pytest.approx(1 / 3) and math.isfinite(stats.mean_ratio)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_behaviour_logprob_minus_inf_is_capped_and_nan_or_plus_inf_refused(dtype):
    loss, g = one(float("inf"), -1.0, dtype)  # behaviour logprob -inf: ratio -> inf, capped
    assert (loss, g) == (2.0, 0.0)
    for bad in (float("nan"), float("inf")):
        lp = torch.zeros(2, dtype=dtype, requires_grad=True)
        blp = torch.tensor([-1.0, bad], dtype=dtype)
        with pytest.raises(ValueError, match="1 selected behaviour logprobs are NaN or \\+inf"):
            policy_loss(
                lp,
                blp,
                torch.ones(2, dtype=dtype),
                torch.ones(2, dtype=dtype),
                torch.ones(2, dtype=torch.bool),
            )
        # Masked out, the same value is never read (B09).
        loss, _ = policy_loss(
            lp,
            blp,
            torch.ones(2, dtype=dtype),
            torch.ones(2, dtype=dtype),
            torch.tensor([True, False]),
        )
        assert float(loss.detach()) == pytest.approx(-1.2, rel=REL[dtype])  # ratio e, A = 1: clip


def test_the_bound_sits_one_nat_above_the_cap_and_refuses_an_overflowing_cap():
    assert log_ratio_bound(2.0, torch.float32) == pytest.approx(math.log(2.0) + 1.0)
    assert math.exp(log_ratio_bound(2.0, torch.bfloat16)) > 2.0
    with pytest.raises(ValueError, match="is_cap=2e\\+38 is too large"):
        log_ratio_bound(2e38, torch.float32)
    with pytest.raises(ValueError, match="too large for torch.float16"):
        log_ratio_bound(3e4, torch.float16)
