"""Splicing: a rendered prompt text as token IDs that keep the known tokens of a recorded call.

Owns `splice` (the known tokens kept over the longest prefix of the text they spell, the rest
tokenized, and where the two differ). Known tokens are compared by their
bytes inside a text (`TokenText.table`), never re-tokenized: with the text's own bytes for a
tokenizer whose tokens spell the text they encode (byte-level BPE), with the bytes of the whole
text's tokens for one that adds to it (SentencePiece's `▁` at a text's start or after a control
token). With healing, an invalid UTF-8 sequence of the known bytes also matches the U+FFFD a
client echoes for it (`gyre.tito.heal.match_replacements`). Knows nothing about chat messages,
templates or records.
"""

from __future__ import annotations

from collections.abc import Callable

from gyre.tito.detok import TokenText
from gyre.tito.heal import match_replacements, text_offset
from gyre.tito.records import common_prefix_len as common_prefix

__all__ = ["splice"]


def splice(
    text: TokenText,
    encode: Callable[[str], list[int]],
    known: list[int],
    rendered: str,
    *,
    heal: bool,
    faithful: bool,
) -> tuple[list[int], int | None]:
    """(IDs of `rendered`, the index where they first differ from `known` or None when they
    extend it): `known` kept while their bytes prefix the text's (`faithful`: the text's own
    bytes, then `encode` of the rest; else the bytes of `encode(rendered)`, up to a token
    boundary of both, then its tokens from there: O(text))."""
    kb = text.bytes_of(known)
    enc = None if faithful else encode(rendered)
    tb = rendered.encode() if enc is None else text.bytes_of(enc)
    shared = common_prefix(kb, tb)
    spans: list[tuple[int, int]] = []
    if heal and shared < len(tb):
        shared, _, spans = match_replacements(kb, tb, shared)
    table, ntab = text.table, len(text.table)
    pos, j = 0, 0  # the last known token boundary inside the shared bytes
    for t in known:
        size = len(table[t]) if 0 <= t < ntab else 0
        if pos + size > shared:
            break
        pos += size
        j += 1
    if enc is None:
        # ... outside every invalid sequence, where a UTF-8 character of the text starts.
        at = text_offset(pos, spans)
        while j > 0 and (at is None or (at < len(tb) and (tb[at] & 0xC0) == 0x80)):
            j -= 1
            pos -= len(table[known[j]]) if 0 <= known[j] < ntab else 0
            at = text_offset(pos, spans)
        ids = known[:j] + encode(tb[at or 0 :].decode())
    else:
        starts: dict[int, int] = {}  # byte offset in tb -> the first token of enc starting there
        end = 0
        for k, t in enumerate(enc):
            starts.setdefault(end, k)
            end += len(table[t]) if 0 <= t < ntab else 0
        starts.setdefault(end, len(enc))
        # ... where a token of the whole text's starts too.
        while j > 0 and text_offset(pos, spans) not in starts:
            j -= 1
            pos -= len(table[known[j]]) if 0 <= known[j] < ntab else 0
        ids = known[:j] + enc[starts[text_offset(pos, spans) or 0] :]
    if j == len(known):
        return ids, None
    return ids, common_prefix(ids, known)
