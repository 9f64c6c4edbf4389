"""Hidden tests (generated)."""


def test_seq_term_0():
    from amber_heron.seqs import seq_term
    assert seq_term(2) == 4


def test_seq_term_1():
    from amber_heron.seqs import seq_term
    assert seq_term(11) == 322


def test_parse_pairs_0():
    from amber_heron.seqs import parse_pairs
    assert parse_pairs('x=1, y = two ,') == {'x': '1', 'y': 'two'}


def test_parse_pairs_1():
    from amber_heron.seqs import parse_pairs
    assert parse_pairs('k=v=w,,a=b') == {'k': 'v=w', 'a': 'b'}
