"""The reference tiny model: recipe (Qwen2 + local BPE + ChatML template), the behaviour-logprob
reference (`behaviour_logprobs`) and the warm start (`demonstrations`, `sft`, `offline_eval`).

`python -m gyre.model init DIR --seed N` writes a Hugging Face folder that transformers and vLLM
load; `sft` fine-tunes it on demonstrations, `demos` writes them as JSON lines.
"""

from gyre.model.recipe import (
    EOS_TOKEN,
    PAD_TOKEN,
    RECIPE,
    SPECIAL_TOKENS,
    TAG_TOKENS,
    build_model,
    build_tokenizer,
    chat_template,
    init_model_dir,
    is_tiny_model,
)

__all__ = [
    "EOS_TOKEN",
    "PAD_TOKEN",
    "RECIPE",
    "SPECIAL_TOKENS",
    "TAG_TOKENS",
    "build_model",
    "build_tokenizer",
    "chat_template",
    "init_model_dir",
    "is_tiny_model",
]
