"""Byte-level detokenisation equals the tokenizer's own decode, special tokens included."""

from __future__ import annotations

from gyre.tito.detok import TokenText
from tests.tito.conftest import encode


def test_token_text_matches_the_tokenizer(tok):
    table = TokenText(tok)
    ids = encode(tok, 'héllo 字 <tool_call>{"a": 1}</tool_call> 🎉') + [tok.eos_token_id]
    assert table.decode(ids) == tok.decode(ids, skip_special_tokens=False)
    assert table.decode(list(range(len(tok)))) == tok.decode(
        list(range(len(tok))), skip_special_tokens=False
    )
