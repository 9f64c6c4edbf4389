"""Hidden tests (generated)."""


def test_parse_pairs_0():
    from tiny_maple.parse import parse_pairs
    assert parse_pairs('x=1; y = two ;') == {'x': '1', 'y': 'two'}


def test_parse_pairs_1():
    from tiny_maple.parse import parse_pairs
    assert parse_pairs('k=v=w;;a=b') == {'k': 'v=w', 'a': 'b'}


def test_word_counts_0():
    from tiny_maple.parse import word_counts
    assert word_counts('a b a c b a') == {'a': 3, 'b': 2, 'c': 1}


def test_word_counts_1():
    from tiny_maple.parse import word_counts
    assert word_counts('the cat and the hat') == {'the': 2, 'cat': 1, 'and': 1, 'hat': 1}
