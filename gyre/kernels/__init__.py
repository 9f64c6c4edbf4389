"""Kernels with a plain-torch reference and an `impl` switch (docs/style.md rule 8).

Tree attention (`tree_mask`, `tree_block_mask`, `model_attention_mask`, `tree_attention`), tree
attention over DFS chunks with the ancestors' K/V cached (`TreeKVCache`, `ancestor_paths`: what the
trainer runs, memory linear in tokens), the backend checks a trainer runs at start-up
(`check_attention_backend`, `check_logprob_backend`) and the fused selective logprob + entropy
(`selective_logprob_entropy`). The Triton kernel is imported on
first use only, so importing this package never needs a GPU driver.
"""

from gyre.kernels.cached_tree_attention import (
    TreeKVCache,
    ancestor_paths,
    check_attention_backend,
    check_logprob_backend,
)
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
    "TreeKVCache",
    "ancestor_paths",
    "check_attention_backend",
    "check_logprob_backend",
    "selective_logprob_entropy",
    "selective_logprob_entropy_reference",
]
