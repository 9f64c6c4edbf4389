"""The reference tiny model: a Qwen2 decoder, a locally trained byte-level BPE and a ChatML
template.

Owns `build_tokenizer`, `build_model` and `init_model_dir`, which write a Hugging Face folder that
both transformers and vLLM load (no hub download anywhere). Deterministic for a seed: the same
seed gives byte-identical files. Knows nothing about engines, training or tasks.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from gyre.config import ModelConfig

__all__ = [
    "SPECIAL_TOKENS",
    "TAG_TOKENS",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "chat_template",
    "build_tokenizer",
    "build_model",
    "init_model_dir",
    "RECIPE",
    "is_tiny_model",
]

RECIPE = "gyre-tiny-qwen2"
"""The `recipe` that `init_model_dir` writes into `<dir>/gyre_model.json` (the warm start copies
the file into its output folder): how the built-in tiny model is recognised."""
PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, "<|im_start|>", EOS_TOKEN)
"""Control tokens: never produced by the BPE, skipped by `decode(skip_special_tokens=True)`."""
TAG_TOKENS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
"""Structural tags: one ID each, but kept in decoded text (the proxy parses them)."""

_WORDS = (
    "the a an of to in is it and or not for with on as at by from file line word list read write "
    "run test pass fail error value name path dir src main def return import class self print if "
    "else elif while for break continue true false none json yaml toml config key user system "
    "assistant tool call result output input number string sum add sub mul count sort unique "
    "reverse upper lower split join strip replace find grep sed awk cat ls cd mkdir rm cp mv echo "
    "python pytest package module function argument spec implement build repository agent task"
).split()
_SNIPPETS = (
    "def add(a, b):\n    return a + b\n",
    'import json\n\nwith open("config.json") as f:\n    data = json.load(f)\n',
    "class Stack:\n    def __init__(self):\n        self.items = []\n",
    "for i in range(10):\n    print(i)\n",
    "$ ls -la src/\n$ cat README.md | grep -n TODO\n$ python -m pytest -q\n",
    '{"name": "write_file", "arguments": {"path": "out.txt", "content": "hello"}}',
    '{"name": "run", "arguments": {"command": "echo 42 > answer.txt"}}',
    '[section]\nkey = "value"\nnumber = 3\n',
)


def chat_template() -> str:
    """The ChatML template shipped with the tokenizer (`chat_template.jinja` beside this file)."""
    return (Path(__file__).with_name("chat_template.jinja")).read_text()


def _corpus(seed: int, num_lines: int = 3000) -> list[str]:
    rng = random.Random(seed)
    lines = list(_SNIPPETS) * 20
    for _ in range(num_lines):
        n = rng.randint(3, 14)
        lines.append(
            " ".join(rng.choice(_WORDS) for _ in range(n)) + rng.choice((".", "\n", ":", "?"))
        )
        lines.append(f"{rng.choice(_WORDS)}_{rng.randint(0, 999)}.py {rng.randint(0, 99999)}")
    rng.shuffle(lines)
    return lines


def build_tokenizer(vocab_size: int = 1024, seed: int = 0):
    """Train a byte-level BPE on a seeded synthetic corpus and wrap it for transformers.

    Returns a `transformers.PreTrainedTokenizerFast` with `len(tok) <= vocab_size`: every byte is
    one token (the 256-symbol ByteLevel alphabet), merges fill the rest. `eos_token` is
    `<|im_end|>`, `pad_token` `<|endoftext|>`, no BOS; the chat template is attached.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    reserved = len(SPECIAL_TOKENS) + len(TAG_TOKENS)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TAG_TOKENS),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        clean_up_tokenization_spaces=False,
    )
    hf.add_tokens(list(TAG_TOKENS))
    hf.chat_template = chat_template()
    assert len(hf) <= vocab_size and len(hf) > 256 + reserved, len(hf)
    return hf


def build_model(config: ModelConfig, vocab_size: int):
    """A randomly initialised `transformers.Qwen2ForCausalLM` (float32) seeded by `config.seed`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hf_config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=False,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = Qwen2ForCausalLM(hf_config)
    # transformers wraps `to` with functools.wraps, whose stub does not bind `self`
    return model.to(torch.float32).eval()  # type: ignore[arg-type]


def init_model_dir(path: str | Path, config: ModelConfig = ModelConfig()) -> Path:
    """Write the tiny model, tokenizer and chat template to `path` (a Hugging Face folder).

    Raises `FileExistsError` if `path` exists and is not an empty folder.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"model folder {str(path)!r} exists and is not a folder")
    if path.exists() and any(path.iterdir()):
        raise FileExistsError(f"model folder {str(path)!r} exists and is not empty")
    path.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(config.vocab_size, config.seed)
    model = build_model(config, len(tok))
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.config.eos_token_id = tok.eos_token_id
    model.config.pad_token_id = tok.pad_token_id
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    (path / "gyre_model.json").write_text(
        json.dumps({"recipe": RECIPE, "seed": config.seed}) + "\n"
    )
    return path


def is_tiny_model(path: str | Path) -> bool:
    """Whether the folder `path` holds the built-in tiny model (or its warm start): its
    `gyre_model.json` names `RECIPE`. False for a missing folder, any other model, or a marker
    that is not a JSON object."""
    marker = Path(path) / "gyre_model.json"
    try:
        found = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and found.get("recipe") == RECIPE
