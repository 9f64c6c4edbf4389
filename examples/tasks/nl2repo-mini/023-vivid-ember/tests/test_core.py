"""Hidden tests (generated)."""


def test_parse_pairs_0():
    from vivid_ember.core import parse_pairs
    assert parse_pairs('x=1; y = two ;') == {'x': '1', 'y': 'two'}


def test_parse_pairs_1():
    from vivid_ember.core import parse_pairs
    assert parse_pairs('k=v=w;;a=b') == {'k': 'v=w', 'a': 'b'}
