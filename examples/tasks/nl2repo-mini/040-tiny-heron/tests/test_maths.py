"""Hidden tests (generated)."""


def test_add_36_0():
    from tiny_heron.maths import add_36
    assert add_36(-32) == 4


def test_add_36_1():
    from tiny_heron.maths import add_36
    assert add_36(843) == 879


def test_parse_pairs_0():
    from tiny_heron.maths import parse_pairs
    assert parse_pairs('x=1| y = two |') == {'x': '1', 'y': 'two'}


def test_parse_pairs_1():
    from tiny_heron.maths import parse_pairs
    assert parse_pairs('k=v=w||a=b') == {'k': 'v=w', 'a': 'b'}
