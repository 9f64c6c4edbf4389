"""Fused selective logprob + entropy: chunked torch and Triton (interpreter) vs the reference."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gyre.kernels import selective_logprob_entropy, selective_logprob_entropy_reference

ROOT = Path(__file__).resolve().parents[2]


def _inputs(n, h, v, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(n, h, generator=g, dtype=torch.float64) * 2).to(dtype).requires_grad_()
    weight = torch.randn(v, h, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    labels = torch.randint(0, v, (n,), generator=g)
    return hidden, weight, labels


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_torch_chunked_equals_reference_values_and_grads_float64(chunk, temperature):
    hidden, weight, labels = _inputs(13, 8, 50, torch.float64)
    lp, ent = selective_logprob_entropy(
        hidden, weight, labels, temperature=temperature, chunk_size=chunk
    )
    lp_ref, ent_ref = selective_logprob_entropy_reference(
        hidden, weight, labels, temperature=temperature
    )
    torch.testing.assert_close(lp, lp_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ent, ent_ref, rtol=1e-12, atol=1e-12)
    g = torch.Generator().manual_seed(1)
    a = torch.randn(13, generator=g, dtype=torch.float64)
    b = torch.randn(13, generator=g, dtype=torch.float64)
    grads = torch.autograd.grad((a * lp + b * ent).sum(), (hidden, weight))
    grads_ref = torch.autograd.grad((a * lp_ref + b * ent_ref).sum(), (hidden, weight))
    for x, y in zip(grads, grads_ref):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)


def test_gradcheck_float64():
    hidden, weight, labels = _inputs(5, 4, 9, torch.float64)
    assert torch.autograd.gradcheck(
        lambda h, w: selective_logprob_entropy(h, w, labels, chunk_size=2, temperature=0.7),
        (hidden, weight),
    )


def test_b05_temperature_applies_to_logits():
    # logits [2, 1, 0] at T = 0.5: log softmax([4, 2, 0])[0] = -0.14293 (field case B05)
    hidden = torch.tensor([[1.0]], dtype=torch.float64)
    weight = torch.tensor([[2.0], [1.0], [0.0]], dtype=torch.float64)
    lp, _ = selective_logprob_entropy(hidden, weight, torch.tensor([0]), temperature=0.5)
    assert lp.item() == pytest.approx(-0.14293, abs=1e-4)


def test_saved_memory_is_chunk_sized_not_n_by_vocab():
    # B24 (CPU half): nothing of size N x V is kept for backward, only the inputs and per-row stats.
    n, h, v = 64, 8, 1000
    hidden, weight, labels = _inputs(n, h, v, torch.float32)
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, ent = selective_logprob_entropy(hidden, weight, labels, chunk_size=4)
    assert max(saved) == v * h  # the weight itself; no [N, V] logits
    (lp.sum() + ent.sum()).backward()
    assert torch.isfinite(hidden.grad).all() and torch.isfinite(weight.grad).all()


def test_bad_inputs():
    hidden, weight, labels = _inputs(3, 4, 5, torch.float32)
    with pytest.raises(ValueError, match="impl='cuda'"):
        selective_logprob_entropy(hidden, weight, labels, impl="cuda")
    with pytest.raises(ValueError, match="temperature=0"):
        selective_logprob_entropy(hidden, weight, labels, temperature=0)
    with pytest.raises(ValueError, match="max 7"):
        selective_logprob_entropy(hidden, weight, torch.tensor([0, 1, 7]))
    with pytest.raises(ValueError, match="chunk_size=0"):
        selective_logprob_entropy(hidden, weight, labels, chunk_size=0)


def triton_parity_check() -> None:
    """Runs in a fresh interpreter with TRITON_INTERPRET=1 (see the test below)."""
    hidden, weight, labels = _inputs(6, 8, 300, torch.float32, seed=3)
    lp, ent = selective_logprob_entropy(
        hidden, weight, labels, chunk_size=4, impl="triton", temperature=0.8
    )
    lp_ref, ent_ref = selective_logprob_entropy_reference(hidden, weight, labels, temperature=0.8)
    torch.testing.assert_close(lp, lp_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ent_ref, rtol=1e-5, atol=1e-5)
    # Several vocabulary blocks per row (online max / sum-exp across blocks).
    x = torch.randn(5, 700, dtype=torch.float32) * 4
    labels = torch.tensor([0, 699, 350, 1, 512])
    from gyre.kernels.selective_logprob_triton import triton_logprob_entropy

    lp_k, ent_k, lse_k = triton_logprob_entropy(x, labels, block=128)
    logp = torch.log_softmax(x, -1)
    want = logp.gather(1, labels[:, None]).squeeze(1)
    torch.testing.assert_close(lp_k, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent_k, -(logp.exp() * logp).sum(-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse_k, torch.logsumexp(x, -1), rtol=1e-5, atol=1e-5)
    # The backward is shared with impl="torch", so the gradients match it.
    g_t = torch.autograd.grad((lp + ent).sum(), (hidden, weight))
    labels = _inputs(6, 8, 300, torch.float32, seed=3)[2]
    lp2, ent2 = selective_logprob_entropy(hidden, weight, labels, chunk_size=4, temperature=0.8)
    g_ref = torch.autograd.grad((lp2 + ent2).sum(), (hidden, weight))
    for x, y in zip(g_t, g_ref):  # float32 lse noise (~1 ulp of |x|~30) enters p, times |x - E[x]|
        assert (x - y).abs().max() <= 1e-4 * y.abs().max(), ((x - y).abs().max(), y.abs().max())
    print("TRITON_PARITY_OK")


def test_triton_kernel_parity_under_interpreter():
    # TRITON_INTERPRET must be set before triton is imported, so the check runs in a subprocess.
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    code = (
        "from tests.kernels.test_selective_logprob import triton_parity_check; "
        "triton_parity_check()"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "TRITON_PARITY_OK" in done.stdout


def test_per_row_temperature_equals_row_by_row():
    hidden, weight, labels = _inputs(6, 4, 20, torch.float64, seed=4)
    temps = torch.tensor([0.5, 1.0, 0.7, 2.0, 1.0, 0.3], dtype=torch.float64)
    lp, ent = selective_logprob_entropy(hidden, weight, labels, temperature=temps, chunk_size=4)
    for i in range(6):
        lp_i, ent_i = selective_logprob_entropy_reference(
            hidden[i : i + 1], weight, labels[i : i + 1], temperature=float(temps[i])
        )
        torch.testing.assert_close(lp[i : i + 1], lp_i, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ent[i : i + 1], ent_i, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(
        lambda h, w: selective_logprob_entropy(h, w, labels, temperature=temps, chunk_size=4),
        (hidden, weight),
    )
