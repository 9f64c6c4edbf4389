"""Hidden tests (generated)."""


def test_chunks_0():
    from amber_quartz.seqs import chunks
    assert chunks([0, 1, 2, 3, 4, 5, 6, 7]) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_chunks_1():
    from amber_quartz.seqs import chunks
    assert chunks([]) == []


def test_parse_pairs_0():
    from amber_quartz.seqs import parse_pairs
    assert parse_pairs('x=1; y = two ;') == {'x': '1', 'y': 'two'}


def test_parse_pairs_1():
    from amber_quartz.seqs import parse_pairs
    assert parse_pairs('k=v=w;;a=b') == {'k': 'v=w', 'a': 'b'}
