"""A tool call written in a model format as its chat template renders it, and the token IDs a model
samples for that text: for gyre's own format (the tiny tokenizer) and each family of
`tests/tito/families.py`. Used by the reply tests (`test_replies_b33_b37.py`,
`test_reply_roundtrip.py`)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from gyre.model.recipe import build_tokenizer
from gyre.tito.model_format import GyreParser, ModelFormat, ReplyParser
from tests.tito.families import FAMILIES, family_tokenizer

FORMATS = ("gyre", *sorted(FAMILIES))
TOOL = "write_file"
TOOLS = [{"type": "function", "function": {"name": TOOL, "parameters": {"type": "object"}}}]


def format_tokenizer(name: str, folder: Path):
    """The format's tiny tokenizer (gyre: the tiny model's own)."""
    return build_tokenizer() if name == "gyre" else family_tokenizer(name, folder)


def format_parser(name: str, tok) -> ReplyParser:
    """The proxy's parser of the format."""
    if name == "gyre":
        return GyreParser()
    fam = FAMILIES[name]
    return ModelFormat.load(
        tok, tool_parser=fam.tool_parser, reasoning_parser=fam.reasoning_parser
    ).parser


def end_tokens(name: str, tok) -> tuple[str, ...]:
    return (tok.eos_token,) if name == "gyre" else FAMILIES[name].end_tokens


def write_call(tok, name: str, arguments: dict[str, Any]) -> str:
    """One `write_file` call with `arguments`, as the format's template renders an assistant
    turn holding it (the turn's end token cut off; DeepSeek's reasoning parser wants a
    reasoning block first, so one is put there)."""
    mapping = name != "gyre" and FAMILIES[name].arguments_as == "mapping"
    args = arguments if mapping else json.dumps(arguments, ensure_ascii=False)
    call = {"id": "t", "type": "function", "function": {"name": TOOL, "arguments": args}}
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    head = tok.apply_chat_template(msgs, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
    full = tok.apply_chat_template(msgs, tools=TOOLS, tokenize=False)
    assert full.startswith(head)
    text = full[len(head) :]
    text = text[: text.rfind(tok.eos_token)]
    return "<think>r</think>" + text if name == "deepseek" else text


def sampled_ids(tok, name: str, text: str) -> list[int]:
    """`text` as a model samples it: control tokens as tokens, except the format's end tokens,
    which end a reply when sampled: inside an argument they are written as plain text."""
    ends = re.compile("|".join(map(re.escape, end_tokens(name, tok))))
    ids, last = [], 0
    for m in ends.finditer(text):
        ids += tok.encode(text[last : m.start()], add_special_tokens=False)
        ids += tok.encode(m.group(), add_special_tokens=False, split_special_tokens=True)
        last = m.end()
    ids += tok.encode(text[last:], add_special_tokens=False)
    assert tok.decode(ids) == text
    return ids


def byte_ids(tok, raw: bytes) -> list[int]:
    """The byte-level BPE token of each byte of `raw` (GPT-2's byte <-> printable-character
    table; every tokenizer here is byte-level)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    table |= {b: chr(256 + n) for n, b in enumerate(b for b in range(256) if b not in table)}
    return tok.convert_tokens_to_ids([table[b] for b in raw])
