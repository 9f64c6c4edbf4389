"""Byte-level detokenisation: the exact bytes and text of every token ID of one tokenizer.

Owns `TokenText` (token IDs to bytes and text; canonical int objects for IDs; an incremental UTF-8
decoder for streaming), built from GPT-2's byte <-> printable-character table. Generated tokens
are decoded here and never re-tokenized. Knows nothing about chat messages, templates, HTTP or
engines.
"""

from __future__ import annotations

import codecs
from typing import Any

__all__ = ["TokenText"]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable-character table used by byte-level BPE tokenizers."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


class TokenText:
    """Bytes of every token ID of a tokenizer, for exact decoding and incremental UTF-8 streaming.

    Byte-level BPE tokens map to their bytes exactly; added tokens (`<|im_end|>`, `<think>`) to
    their UTF-8 content. Other tokenizers fall back to `decode([id])` per token (exact for whole
    characters only). IDs outside the tokenizer (padded model vocab) decode to no bytes.
    """

    def __init__(self, tokenizer: Any) -> None:
        inverse = {c: b for b, c in _bytes_to_unicode().items()}
        added = {i: t for t, i in tokenizer.get_added_vocab().items()}
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        table: list[bytes] = []
        for i, piece in enumerate(pieces):
            if i in added:
                table.append(added[i].encode())
            elif piece is not None and all(ch in inverse for ch in piece):
                table.append(bytes(inverse[ch] for ch in piece))
            else:
                table.append(tokenizer.decode([i], skip_special_tokens=False).encode())
        self.table = table
        self.ints: list[int] = list(range(len(table)))
        """One int object per token ID: lists of interned IDs copy, compare and get scanned by
        the garbage collector at memory speed (a fresh int per token costs a cache miss each)."""

    def intern(self, ids: list[int]) -> list[int]:
        """`ids` with every in-vocabulary ID replaced by its canonical int object (O(len))."""
        ints, n = self.ints, len(self.ints)
        return [ints[i] if 0 <= i < n else i for i in ids]

    def token_bytes(self, token_id: int) -> bytes:
        return self.table[token_id] if 0 <= token_id < len(self.table) else b""

    def bytes_of(self, ids: list[int]) -> bytes:
        table, n = self.table, len(self.table)
        return b"".join([table[i] if 0 <= i < n else b"" for i in ids])

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`, special tokens included; invalid UTF-8 becomes U+FFFD."""
        return self.bytes_of(ids).decode("utf-8", errors="replace")

    def token_str(self, token_id: int) -> str:
        """The token's own text (a lone part of a multi-byte character shows as U+FFFD)."""
        return self.token_bytes(token_id).decode("utf-8", errors="replace")

    @staticmethod
    def incremental() -> codecs.IncrementalDecoder:
        """A UTF-8 decoder that holds back a character split across tokens until it completes."""
        return codecs.getincrementaldecoder("utf-8")(errors="replace")
