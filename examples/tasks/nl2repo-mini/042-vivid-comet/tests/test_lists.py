"""Hidden tests (generated)."""


def test_rotate_0():
    from vivid_comet.lists import rotate
    assert rotate([0, 1, 2, 3, 4, 5]) == [2, 3, 4, 5, 0, 1]


def test_rotate_1():
    from vivid_comet.lists import rotate
    assert rotate(['a', 'b']) == ['a', 'b']


def test_parse_pairs_0():
    from vivid_comet.lists import parse_pairs
    assert parse_pairs('x=1, y = two ,') == {'x': '1', 'y': 'two'}


def test_parse_pairs_1():
    from vivid_comet.lists import parse_pairs
    assert parse_pairs('k=v=w,,a=b') == {'k': 'v=w', 'a': 'b'}
