"""Hidden tests (generated)."""


def test_add_50_0():
    from quick_falcon.numbers import add_50
    assert add_50(46) == 96


def test_add_50_1():
    from quick_falcon.numbers import add_50
    assert add_50(153) == 203


def test_parse_pairs_0():
    from quick_falcon.numbers import parse_pairs
    assert parse_pairs('x=1, y = two ,') == {'x': '1', 'y': 'two'}


def test_parse_pairs_1():
    from quick_falcon.numbers import parse_pairs
    assert parse_pairs('k=v=w,,a=b') == {'k': 'v=w', 'a': 'b'}
