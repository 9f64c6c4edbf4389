"""Detokenisation: the exact text of a tokenizer's token IDs, whole or streamed token by token.

Owns `TokenText` (per token ID: its bytes inside a text, which the renderer splices prompts on;
canonical int objects for IDs) and `TokenStream` (one choice's text as its tokens come). The
invariant: `TokenText.decode(ids)`, and a stream's pieces joined, equal the tokenizer's own
`decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)` after every token
(a stream holds back only what the next token may still change). Byte-level BPE maps through
GPT-2's byte <-> character table; other decoders (SentencePiece conversions with Metaspace or
Replace/ByteFallback/Fuse/Strip: Llama 2, Mistral, Gemma, Phi-3; Unigram; WordPiece) through two
texts per token taken from the tokenizer's own decoder: its text first in a text (Strip and
Metaspace drop a leading space, WordPiece keeps `##`) and after another token. A run of
byte-fallback pieces (`<0x0A>`) is one UTF-8 text, or one U+FFFD per byte when invalid, so a
stream holds a run until it ends. A tokenizer whose decode needs more context than that (a
suffix decoder that drops the last token's space) is refused with a `ConfigError` when built:
every `TokenText` checks itself against the tokenizer's decode on seeded probe sequences.
Generated tokens are decoded here and never re-tokenized. Knows nothing about chat messages,
templates, HTTP or engines.
"""

from __future__ import annotations

import codecs
import json
import random
from typing import Any

from gyre.errors import ConfigError

__all__ = ["TokenText", "TokenStream"]

_PROBES = 384
"""Probe sequences each `TokenText` checks against the tokenizer's own decode."""


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


def _decoder_types(backend: Any) -> list[str]:
    """The types of the backend's decoder and of its parts (`Sequence`'s decoders)."""
    decoder = backend.decoder
    if decoder is None:
        return []
    spec = json.loads(decoder.__getstate__())
    parts = (spec.get("decoders") or []) if spec.get("type") == "Sequence" else [spec]
    return [str(p.get("type")) for p in parts]


def _byte_piece(piece: str) -> int | None:
    """The byte of a byte-fallback piece `<0xHH>` (the decoder's own test), else None."""
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return int(piece[3:5], 16)
        except ValueError:
            return None
    return None


class TokenText:
    """The text of every token ID of a tokenizer, for exact decoding and streaming.

    `table[id]` is the token's bytes inside a text (a byte-fallback piece its byte, `▁` a space):
    prompt tokens' bytes equal the rendered text's. `decode` and `stream` give what the
    tokenizer's decode gives. IDs outside the tokenizer (a padded model vocab) have no text.

    Raises `ConfigError` when the tokenizer's decode cannot be reproduced token by token.
    """

    def __init__(self, tokenizer: Any) -> None:
        backend = tokenizer.backend_tokenizer
        n = len(tokenizer)
        pieces = tokenizer.convert_ids_to_tokens(list(range(n)))
        added = {i: t for t, i in tokenizer.get_added_vocab().items()}
        types = _decoder_types(backend)
        self.ints: list[int] = list(range(n))
        """One int object per token ID: lists of interned IDs copy, compare and get scanned by
        the garbage collector at memory speed (a fresh int per token costs a cache miss each)."""
        self._absent = frozenset(i for i, p in enumerate(pieces) if p is None)
        self._bytes: dict[int, int] = {}
        """Byte-fallback pieces: ID -> byte (only with a ByteFallback decoder)."""
        self._first: dict[int, str] = {}
        """Text of a token first in a text, where it differs from its text after another."""
        self._mid: list[str] = []
        self._lead = 0
        """Leading spaces the decoder strips from a text that starts with a byte run."""
        self.plain = "ByteLevel" in types
        """Byte-level: a text is its tokens' bytes joined, decoded as UTF-8 (U+FFFD replaces
        invalid sequences); no token reads differently first, no byte runs."""
        if self.plain:
            self.table = self._byte_level_table(tokenizer, pieces, added)
        else:
            self.table = self._piece_table(backend, pieces, set(added), "ByteFallback" in types)
        self._check(backend, types)

    # -- building -----------------------------------------------------------------------------

    @staticmethod
    def _byte_level_table(tokenizer: Any, pieces: list, added: dict[int, str]) -> list[bytes]:
        inverse = {c: b for b, c in _bytes_to_unicode().items()}
        table: list[bytes] = []
        for i, piece in enumerate(pieces):
            if i in added:
                table.append(added[i].encode())
            elif piece is None:
                table.append(b"")
            elif all(ch in inverse for ch in piece):
                table.append(bytes(inverse[ch] for ch in piece))
            else:
                table.append(tokenizer.decode([i], skip_special_tokens=False).encode())
        return table

    def _piece_table(
        self, backend: Any, pieces: list, added: set[int], byte_fallback: bool
    ) -> list[bytes]:
        """Texts from the tokenizer's own decoder: alone (first) and after a reference token."""
        n = len(pieces)
        if byte_fallback:
            for i, p in enumerate(pieces):
                b = None if p is None else _byte_piece(p)
                if b is not None:
                    self._bytes[i] = b
        ref = self._reference(backend, pieces, added)
        present = [i for i in range(n) if i not in self._absent]
        alone = backend.decode_batch([[i] for i in present], skip_special_tokens=False)
        after = backend.decode_batch([[ref, i] for i in present], skip_special_tokens=False)
        head = backend.decode([ref], skip_special_tokens=False)
        mid = [""] * n
        for i, first, both in zip(present, alone, after):
            if not both.startswith(head):
                raise ConfigError(
                    f"the tokenizer's decode cannot be reproduced token by token: token {i} "
                    f"({pieces[i]!r}) changes the text before it ({head!r} -> {both!r})"
                )
            mid[i] = both[len(head) :]
            if first != mid[i] and i not in self._bytes:
                self._first[i] = first
        for i in self._bytes:
            mid[i] = ""
        self._mid = mid
        space = next((i for i, b in self._bytes.items() if b == 0x20), None)
        if space is not None:
            s = backend.decode([space] * 3 + [ref], skip_special_tokens=False)
            self._lead = 3 - (len(s) - len(s.lstrip(" ")))
        byte = self._bytes
        return [bytes([byte[i]]) if i in byte else m.encode() for i, m in enumerate(mid)]

    def _reference(self, backend: Any, pieces: list, added: set[int]) -> int:
        """A plain token to decode every token after: its own text is letters and digits."""
        for i, p in enumerate(pieces):
            if p is None or i in self._bytes or i in added:
                continue
            text = backend.decode([i], skip_special_tokens=True)
            if text and text.isalnum():
                return i
        raise ConfigError("the tokenizer has no token of letters or digits to decode after")

    def _check(self, backend: Any, types: list[str]) -> None:
        """Raise `ConfigError` unless `decode` equals the tokenizer's decode on seeded probes:
        random IDs, and byte pieces, added tokens and spaces among them."""
        n = len(self.table)
        rng = random.Random(0)
        spaces = [i for i, b in enumerate(self.table) if b and not b.strip()]
        pools = [p for p in (list(self._bytes), sorted(self._first), spaces) if p]
        seqs = []
        for _ in range(_PROBES):
            seq = []
            for _ in range(rng.randint(1, 10)):
                pool = rng.choice(pools) if pools and rng.random() < 0.5 else None
                seq.append(rng.choice(pool) if pool else rng.randrange(n))
            seqs.append(seq)
        expected = backend.decode_batch(seqs, skip_special_tokens=False)
        for seq, want in zip(seqs, expected):
            got = self.decode(seq)
            if got != want:
                raise ConfigError(
                    "the tokenizer's decode cannot be reproduced token by token (decoder "
                    f"{'+'.join(types) or 'none'}): IDs {seq} decode to {want!r}, their tokens' "
                    f"texts give {got!r}"
                )

    # -- use ----------------------------------------------------------------------------------

    def intern(self, ids: list[int]) -> list[int]:
        """`ids` with every in-vocabulary ID replaced by its canonical int object (O(len))."""
        ints, n = self.ints, len(self.ints)
        return [ints[i] if 0 <= i < n else i for i in ids]

    def token_bytes(self, token_id: int) -> bytes:
        """The token's bytes inside a text."""
        return self.table[token_id] if 0 <= token_id < len(self.table) else b""

    def bytes_of(self, ids: list[int]) -> bytes:
        """The tokens' bytes inside a text, joined (what a prompt of them spells)."""
        table, n = self.table, len(self.table)
        return b"".join([table[i] if 0 <= i < n else b"" for i in ids])

    def decode(self, ids: list[int]) -> str:
        """The tokenizer's `decode(ids, skip_special_tokens=False)`: special tokens included,
        invalid UTF-8 as U+FFFD."""
        if self.plain:
            return self.bytes_of(ids).decode("utf-8", errors="replace")
        stream = self.stream()
        return "".join([stream.push(t) for t in ids]) + stream.end()

    def context_text(self, ids: list[int]) -> str:
        """What `ids` spell inside a text, after other tokens (a prompt's view: no leading space
        dropped, byte pieces as their bytes); invalid UTF-8 as U+FFFD."""
        return self.bytes_of(ids).decode("utf-8", errors="replace")

    def token_str(self, token_id: int) -> str:
        """The token's own text (a lone part of a multi-byte character shows as U+FFFD)."""
        return self.token_bytes(token_id).decode("utf-8", errors="replace")

    def stream(self) -> TokenStream:
        """A decoder for one sequence, fed token by token."""
        return _ByteStream(self) if self.plain else _PieceStream(self)


class TokenStream:
    """One sequence's text, token by token: `push(id)` returns the text now final, `end()` the
    rest. After each push, what was returned so far is a prefix of the tokenizer's decode of the
    IDs so far, and with `end()` it is all of it."""

    def push(self, token_id: int) -> str:
        raise NotImplementedError

    def end(self) -> str:
        raise NotImplementedError


class _ByteStream(TokenStream):
    """Byte-level: an incremental UTF-8 decoder holds back a character split across tokens."""

    __slots__ = ("_table", "_n", "_utf8")

    def __init__(self, text: TokenText) -> None:
        self._table, self._n = text.table, len(text.table)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace").decode

    def push(self, token_id: int) -> str:
        return self._utf8(self._table[token_id] if 0 <= token_id < self._n else b"")

    def end(self) -> str:
        return self._utf8(b"", True)


class _PieceStream(TokenStream):
    """Pieces: the first token's own first text, a byte run held until a piece ends it."""

    __slots__ = ("_t", "_run", "_started")

    def __init__(self, text: TokenText) -> None:
        self._t = text
        self._run = bytearray()
        self._started = False

    def push(self, token_id: int) -> str:
        t = self._t
        if not 0 <= token_id < len(t._mid) or token_id in t._absent:
            return ""  # the tokenizer's decode skips IDs it does not have
        b = t._bytes.get(token_id)
        if b is not None:
            self._run.append(b)
            return ""
        out = self._flush() if self._run else ""
        if not self._started:
            self._started = True
            return out + t._first.get(token_id, t._mid[token_id])
        return out + t._mid[token_id]

    def end(self) -> str:
        return self._flush() if self._run else ""

    def _flush(self) -> str:
        run = bytes(self._run)
        self._run.clear()
        try:
            text = run.decode("utf-8")
        except UnicodeDecodeError:
            text = "\ufffd" * len(run)  # the ByteFallback decoder's rule for an invalid run
        if not self._started:
            self._started = True
            lead = len(text) - len(text.lstrip(" "))
            text = text[min(lead, self._t._lead) :]
        return text
