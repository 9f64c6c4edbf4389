"""Hidden tests (generated)."""


def test_parse_pairs_0():
    from misty_heron.core import parse_pairs
    assert parse_pairs('x=1| y = two |') == {'x': '1', 'y': 'two'}


def test_parse_pairs_1():
    from misty_heron.core import parse_pairs
    assert parse_pairs('k=v=w||a=b') == {'k': 'v=w', 'a': 'b'}


def test_flatten_0():
    from misty_heron.core import flatten
    assert flatten([1, [2, [3, 4]], 5]) == [1, 2, 3, 4, 5]


def test_flatten_1():
    from misty_heron.core import flatten
    assert flatten([[], ['a'], [['b']]]) == ['a', 'b']
