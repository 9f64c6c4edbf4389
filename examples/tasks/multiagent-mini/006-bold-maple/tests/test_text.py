"""Hidden tests (generated)."""


def test_median_0():
    from bold_maple.text import median
    assert median([6, 2, 14, 16, 8]) == 8.0


def test_median_1():
    from bold_maple.text import median
    assert median([15, 1, 19, 1]) == 8.0


def test_parse_pairs_0():
    from bold_maple.text import parse_pairs
    assert parse_pairs('x=1, y = two ,') == {'x': '1', 'y': 'two'}


def test_parse_pairs_1():
    from bold_maple.text import parse_pairs
    assert parse_pairs('k=v=w,,a=b') == {'k': 'v=w', 'a': 'b'}
