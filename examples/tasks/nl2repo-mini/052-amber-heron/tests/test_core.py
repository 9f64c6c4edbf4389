"""Hidden tests (generated)."""


def test_initials_0():
    from amber_heron.core import initials
    assert initials('grace brewster hopper') == 'G.B.H.'


def test_initials_1():
    from amber_heron.core import initials
    assert initials('alan') == 'A.'


def test_parse_pairs_0():
    from amber_heron.core import parse_pairs
    assert parse_pairs('x=1; y = two ;') == {'x': '1', 'y': 'two'}


def test_parse_pairs_1():
    from amber_heron.core import parse_pairs
    assert parse_pairs('k=v=w;;a=b') == {'k': 'v=w', 'a': 'b'}
