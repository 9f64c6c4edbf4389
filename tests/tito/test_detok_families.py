"""Detokenization per tokenizer family (`gyre.tito.detok`): for random token IDs of byte-level
BPE and of the SentencePiece, Unigram and WordPiece layouts of `tests/tito/sp_families.py`, the
text streamed after every token is the tokenizer's own decode of the IDs so far, less only what
the next token may still change, and `TokenText.decode` is all of it. A layout no token-by-token
text can reproduce is refused when the proxy starts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.engines.scripted import ScriptedEngine
from gyre.errors import ConfigError
from gyre.model.recipe import build_tokenizer
from gyre.tito.detok import TokenText
from tests.tito.conftest import make_proxy
from tests.tito.families import family_tokenizer
from tests.tito.sp_families import MISTRAL_V3_CONTROLS, sp_tokenizer

FAMILIES = ("llama2", "metaspace", "gemma", "unigram", "wordpiece", "tiny", "deepseek")


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    root = tmp_path_factory.mktemp("detok")
    out = {"tiny": build_tokenizer(), "deepseek": family_tokenizer("deepseek", root / "ds")}
    for layout in FAMILIES[:5]:
        out[layout] = sp_tokenizer(layout, root / layout, controls=MISTRAL_V3_CONTROLS)
    return {name: (tok, TokenText(tok)) for name, tok in out.items()}


def reference(tok, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def id_lists(tok) -> st.SearchStrategy[list[int]]:
    """IDs of the whole vocabulary and two past it (a padded model vocab), with byte pieces,
    control tokens and space pieces drawn often."""
    n = len(tok)
    byte_ids = [i for i in range(n) if (tok.convert_ids_to_tokens(i) or "").startswith("<0x")]
    added = sorted(tok.get_added_vocab().values())
    spaces = [i for i in range(n) if tok.convert_ids_to_tokens(i) in ("▁", "Ġ", "Ċ", "▁▁")]
    pools = [st.integers(0, n + 1)] + [st.sampled_from(p) for p in (byte_ids, added, spaces) if p]
    return st.lists(st.one_of(*pools), max_size=24)


@pytest.mark.parametrize("name", FAMILIES)
@settings(max_examples=120, deadline=None)
@given(data=st.data())
def test_stream_is_the_tokenizers_decode_at_every_prefix(tokenizers, name, data):
    tok, text = tokenizers[name]
    ids = data.draw(id_lists(tok))
    stream, sent = text.stream(), ""
    for k in range(1, len(ids) + 1):
        sent += stream.push(ids[k - 1])
        want = reference(tok, ids[:k])
        assert text.decode(ids[:k]) == want
        assert want.startswith(sent), (ids[:k], want, sent)
        held = want[len(sent) :]
        if text.plain:  # only a character split across tokens waits (U+FFFD until complete)
            assert set(held) <= {"\ufffd"}
        elif held:  # only a run of byte pieces waits (IDs past the vocabulary are skipped)
            last = tok.convert_ids_to_tokens(ids[k - 1]) if ids[k - 1] < len(tok) else None
            assert last is None or last.startswith("<0x")
    assert sent + stream.end() == reference(tok, ids)


def test_byte_fallback_layouts_spell_spaces_newlines_and_bytes(tokenizers):
    for name in ("llama2", "metaspace", "gemma"):
        tok, text = tokenizers[name]
        for s in ("Sure, I will run ls -la now.", "line one\nline two", "读 🎉 ok"):
            ids = tok.encode(s, add_special_tokens=False)
            assert text.decode(ids) == s == reference(tok, ids)
        # An invalid run is one U+FFFD per byte; a run cut short waits in a stream.
        e8, af = tok.convert_tokens_to_ids(["<0xE8>", "<0xAF>"])
        assert text.decode([e8, af]) == "\ufffd\ufffd" == reference(tok, [e8, af])
        stream = text.stream()
        assert (stream.push(e8), stream.push(af), stream.end()) == ("", "", "\ufffd\ufffd")


def test_a_decoder_that_needs_the_next_token_is_refused_at_proxy_start(tmp_path):
    tok = sp_tokenizer("suffix", tmp_path / "suffix")  # `</w>` is a space unless last
    with pytest.raises(ConfigError, match="cannot be reproduced token by token"):
        make_proxy(tok, ScriptedEngine(vocab_size=len(tok)))
