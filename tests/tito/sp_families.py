"""Tiny tokenizers in the `tokenizer.json` layouts of SentencePiece-converted and other non
byte-level families, trained locally with `tokenizers` (no hub download), for the detokenization
and model-format tests.

`sp_tokenizer(layout, folder, ...)` trains a small model on an ASCII corpus, lays it out as the
family's `tokenizer.json` does, saves it with `transformers` and loads it back with
`AutoTokenizer` (so `name_or_path` is the folder, as for a real model). Layouts:

- `llama2` (Llama 2, Mistral v0.1, Phi-3): BPE with byte fallback (`<0x00>`..`<0xFF>` as
  ordinary pieces after `<unk>`, `<s>`, `</s>`), the legacy normalizer Prepend("▁") +
  Replace(" ", "▁"), the decoder Replace/ByteFallback/Fuse/Strip(1 leading space).
- `metaspace` (the same models' files converted with `legacy=False` or written by newer
  `tokenizers`): the same model and decoder, the Metaspace pre-tokenizer (prepend "first", no
  split) instead of the normalizer.
- `gemma`: normalizer Replace(" ", "▁") only (no prefix space), the decoder without Strip.
- `unigram` (T5-style): a Unigram model, Metaspace pre-tokenizer and Metaspace decoder.
- `wordpiece` (BERT-style): WordPiece with its `##` decoder (which drops a space before
  punctuation).
- `suffix` (openai-gpt style): BPE pieces ending words with `</w>`, whose decoder turns the
  suffix into a space except on the last token: no token's text can say whether it is last.

Characters outside the ASCII corpus (a newline, CJK, emoji) are byte pieces in the byte-fallback
layouts. `MISTRAL_V3_TEMPLATE` is a chat template in Mistral's pre-v11 tool format
(`[TOOL_CALLS] [{...}]`, `[TOOL_RESULTS]`), checking tool-call IDs as Mistral's templates do;
`mistral_v3_tokenizer` the `metaspace` layout with its control tokens and that template.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerFast

LAYOUTS = ("llama2", "metaspace", "gemma", "unigram", "wordpiece", "suffix")
BYTE_FALLBACK = ("llama2", "metaspace", "gemma")

_WORDS = (
    "the a an of to in is it and or not for with on as at by from file line word list read "
    "write run test pass fail error value name path sure will now ls la cat grep echo python "
    "tool call result output input number string sum sort done here this that yes no ok I "
    "holds one two three"
).split()
_PUNCT = (".", ",", ":", "?", "!", " -la", " -n", "()", '"', "{", "}", "[", "]", "_", "/")

MISTRAL_V3_CONTROLS = (
    "[INST]",
    "[/INST]",
    "[TOOL_CALLS]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
)

MISTRAL_V3_TEMPLATE = """{%- set ns = namespace(index=0, last_user=-1) %}
{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}
{%- endfor %}
{%- for m in messages %}{% if m.role == 'system' %}{% elif m.role == 'tool' or m.tool_calls %}
{%- elif (m.role == 'user') != (ns.index % 2 == 0) %}
{{- raise_exception('After the optional system message, conversation roles must alternate') }}
{%- else %}{% set ns.index = ns.index + 1 %}{% endif %}{% endfor %}
{{- bos_token }}
{%- for m in messages %}
{%- if m.role == 'user' %}
{%- if tools and loop.index0 == ns.last_user %}[AVAILABLE_TOOLS] {{ tools | tojson }}
{{- '[/AVAILABLE_TOOLS]' }}{% endif %}
{{- '[INST] ' + m.content + '[/INST]' }}
{%- elif m.tool_calls %}[TOOL_CALLS] [
{%- for tc in m.tool_calls %}
{%- if tc.id is not defined or tc.id | length != 9 or not tc.id.isalnum() %}
{{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}
{%- endif %}{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments }}}
{%- if not loop.last %}, {% endif %}{% endfor %}]{{ eos_token }}
{%- elif m.role == 'assistant' %}{{ ' ' + m.content | trim + eos_token }}
{%- elif m.role == 'tool' %}
{%- if m.tool_call_id is not defined or m.tool_call_id | length != 9
    or not m.tool_call_id.isalnum() %}
{{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}
{%- endif %}
{{- '[TOOL_RESULTS] {"content": ' + m.content | tojson + ', "call_id": "' + m.tool_call_id
    + '"}[/TOOL_RESULTS]' }}
{%- endif %}
{%- endfor %}"""
"""Mistral v0.3's format (Mixtral, Nemo alike): the assistant's call is written as the model
samples it (`[TOOL_CALLS] [{"name": ..., "arguments": {...}}]`), the tool-call ID goes into the
tool result, and both refuse an ID that is not 9 alphanumeric characters; the tools are written
before the last user message. (Mistral's own
templates also write the ID into the assistant's call, which the model never samples: every
tool turn then re-renders differently from the sampled tokens, whatever the ID.)"""


def _corpus(seed: int, num_lines: int = 1500) -> list[str]:
    rng = random.Random(seed)
    lines = ["Sure, I will run ls -la now.", "It holds one line.", '{"cmd": "ls -la"}'] * 30
    for _ in range(num_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(2, 10))]
        lines.append(" ".join(words) + rng.choice(_PUNCT))
    return lines


def _sp_model_json(layout: str, seed: int, vocab_size: int) -> dict[str, Any]:
    """The `model` of a BPE with byte fallback: `<unk>` `<s>` `</s>`, the 256 byte pieces, then
    the pieces and merges of a BPE trained on the corpus (as in Llama's and Mistral's files)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if layout == "gemma":
        tok.normalizer = normalizers.Replace(" ", "▁")
        tok.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 259, show_progress=False)
    tok.train_from_iterator(_corpus(seed), trainer)
    trained = json.loads(tok.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(piece, len(vocab))
    return {
        "type": "BPE",
        "dropout": None,
        "unk_token": "<unk>",
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": True,
        "byte_fallback": True,
        "ignore_merges": False,
        "vocab": vocab,
        "merges": trained["merges"],
    }


_SP_DECODER = {
    "type": "Sequence",
    "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0},
    ],
}


def _added(i: int, content: str, special: bool = True) -> dict[str, Any]:
    return {
        "id": i,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": special,
    }


def _layout_json(layout: str, seed: int, vocab_size: int) -> dict[str, Any]:
    """The whole `tokenizer.json` of `layout` (no post-processor: the templates write BOS)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if layout in BYTE_FALLBACK:
        model = _sp_model_json(layout, seed, vocab_size)
        added = [_added(i, t) for i, t in enumerate(("<unk>", "<s>", "</s>"))]
        out: dict[str, Any] = {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": None,
            "post_processor": None,
            "decoder": _SP_DECODER,
            "model": model,
        }
        if layout == "llama2":
            out["normalizer"] = {
                "type": "Sequence",
                "normalizers": [
                    {"type": "Prepend", "prepend": "▁"},
                    {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
                ],
            }
        elif layout == "metaspace":
            out["pre_tokenizer"] = {
                "type": "Metaspace",
                "replacement": "▁",
                "prepend_scheme": "first",
                "split": False,
            }
        else:  # gemma
            out["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
            out["decoder"] = {"type": "Sequence", "decoders": _SP_DECODER["decoders"][:3]}
        return out
    if layout == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
        tok.decoder = decoders.Metaspace(prepend_scheme="always")
        trainer = trainers.UnigramTrainer(
            vocab_size=vocab_size,
            special_tokens=["<pad>", "</s>", "<unk>"],
            unk_token="<unk>",
            show_progress=False,
        )
    elif layout == "suffix":
        tok = Tokenizer(models.BPE(end_of_word_suffix="</w>", unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.decoder = decoders.BPEDecoder(suffix="</w>")
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=["<unk>"],
            end_of_word_suffix="</w>",
            show_progress=False,
        )
    elif layout == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=False)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size,
            special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
            show_progress=False,
        )
    else:
        raise ValueError(f"layout={layout!r} is not one of {LAYOUTS}")
    tok.train_from_iterator(_corpus(seed), trainer)
    return json.loads(tok.to_str())


def sp_tokenizer(
    layout: str,
    folder: Path,
    *,
    controls: tuple[str, ...] = (),
    template: str | None = None,
    ends: tuple[str, ...] = (),
    vocab_size: int = 600,
    seed: int = 0,
):
    """The `layout` tokenizer with `controls` added as special tokens and `template` as its chat
    template, saved to and loaded back from `folder` with `AutoTokenizer`; its
    `generation_config.json` ends replies at the EOS and at `ends`."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(json.dumps(_layout_json(layout, seed, vocab_size)))
    specials: dict[str, Any] = {}
    if layout in BYTE_FALLBACK:
        specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    elif layout == "unigram":
        specials = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    elif layout == "suffix":
        specials = {"unk_token": "<unk>"}
    else:
        specials = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]"}
    hf = PreTrainedTokenizerFast(
        tokenizer_object=backend, clean_up_tokenization_spaces=False, **specials
    )
    if controls:
        hf.add_special_tokens({"additional_special_tokens": list(controls)})
    if template is not None:
        hf.chat_template = template
    folder.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(folder)
    end_ids = [hf.eos_token_id] if hf.eos_token_id is not None else []
    end_ids += hf.convert_tokens_to_ids(list(ends))
    if end_ids:
        (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": end_ids}))
    return AutoTokenizer.from_pretrained(folder)


def mistral_v3_tokenizer(folder: Path):
    """A tiny model in Mistral's pre-v11 layout (v0.3, Mixtral, Nemo): the Metaspace
    SentencePiece layout, `[INST]` `[TOOL_CALLS]` `[TOOL_RESULTS]` ... as control tokens, no
    `[ARGS]` (vLLM's `mistral` parser reads `[TOOL_CALLS] [{...}]` then), and
    `MISTRAL_V3_TEMPLATE`."""
    return sp_tokenizer(
        "metaspace", folder, controls=MISTRAL_V3_CONTROLS, template=MISTRAL_V3_TEMPLATE
    )
