"""Hidden tests (generated)."""


def test_parse_pairs_0():
    from bold_ember.lists import parse_pairs
    assert parse_pairs('x=1; y = two ;') == {'x': '1', 'y': 'two'}


def test_parse_pairs_1():
    from bold_ember.lists import parse_pairs
    assert parse_pairs('k=v=w;;a=b') == {'k': 'v=w', 'a': 'b'}
