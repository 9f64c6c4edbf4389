"""Triton row reduction for `selective_logprob_entropy(impl="triton")`.

Owns `triton_logprob_entropy`: for each row of a logits chunk x_CV, an online (one pass over V in
blocks) max / sum-exp / sum p*x gives lse, the label's logprob and the entropy
`lse - sum(p * x)`. One program per row. On CPU it runs only in Triton's interpreter, which
must be switched on (TRITON_INTERPRET=1) before `triton` is first imported in the process (the
library's own jitted helpers are decorated at import): slow, for parity tests on small shapes.
Needs the `triton` package; `gyre.kernels.selective_logprob` imports it only for impl="triton".
Knows nothing about models or losses. Shape suffix legend: `C` rows of the chunk, `V` vocabulary.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["triton_logprob_entropy"]


@triton.jit
def _logprob_entropy_kernel(
    x_ptr, labels_ptr, lp_ptr, ent_ptr, lse_ptr, V, stride_row, BLOCK: tl.constexpr
):
    row = tl.program_id(0)
    base = x_ptr + row * stride_row
    # fp32 scalars typed up front: loop-carried values must keep one type when compiled
    m = tl.max(tl.full([BLOCK], -float("inf"), tl.float32), 0)
    s = tl.sum(tl.zeros([BLOCK], tl.float32), 0)
    sx = tl.sum(tl.zeros([BLOCK], tl.float32), 0)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        inside = offs < V
        x = tl.load(base + offs, mask=inside, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, 0))
        e = tl.exp(x - m_new)
        scale = tl.exp(m - m_new)
        s = s * scale + tl.sum(e, 0)
        sx = sx * scale + tl.sum(e * tl.where(inside, x, 0.0), 0)  # not where(inside, e*x): 0*-inf
        m = m_new
    lse = m + tl.log(s)
    label = tl.load(labels_ptr + row)
    x_label = tl.load(base + label).to(tl.float32)
    tl.store(lp_ptr + row, x_label - lse)
    tl.store(ent_ptr + row, lse - sx / s)
    tl.store(lse_ptr + row, lse)


def triton_logprob_entropy(x_CV: torch.Tensor, labels_C: torch.Tensor, *, block: int = 1024):
    """(logprob_C, entropy_C, lse_C) of each row of x_CV (float32 math; returned in x_CV's dtype).

    x_CV [C, V] float, contiguous rows; labels_C [C] int64 in [0, V). Raises `ValueError` for a
    non-2D input or mismatched label count, `RuntimeError` from Triton when no driver is active
    (CPU without TRITON_INTERPRET=1).
    """
    if x_CV.ndim != 2 or labels_C.shape != (x_CV.shape[0],):
        raise ValueError(
            f"x_CV {tuple(x_CV.shape)} must be [C, V] with labels_C of shape (C,), "
            f"got {tuple(labels_C.shape)}"
        )
    x_CV = x_CV.contiguous()
    rows, vocab = x_CV.shape
    out = [torch.empty(rows, dtype=torch.float32, device=x_CV.device) for _ in range(3)]
    if rows:
        block = min(block, triton.next_power_of_2(vocab))
        _logprob_entropy_kernel[(rows,)](
            x_CV, labels_C.contiguous(), *out, vocab, x_CV.stride(0), BLOCK=block
        )
    return tuple(o.to(x_CV.dtype) for o in out)
