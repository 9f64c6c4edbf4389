"""Kernels with a plain-torch reference and an `impl` switch (docs/style.md rule 8).

Tree attention (`tree_mask`, `tree_block_mask`, `model_attention_mask`, `tree_attention`) and the
fused selective logprob + entropy (`selective_logprob_entropy`). The Triton kernel is imported on
first use only, so importing this package never needs a GPU driver.
"""

from gyre.kernels.selective_logprob import (
    selective_logprob_entropy,
    selective_logprob_entropy_reference,
)
from gyre.kernels.tree_attention import (
    model_attention_mask,
    tree_attention,
    tree_block_mask,
    tree_mask,
)

__all__ = [
    "tree_mask",
    "tree_block_mask",
    "model_attention_mask",
    "tree_attention",
    "selective_logprob_entropy",
    "selective_logprob_entropy_reference",
]
