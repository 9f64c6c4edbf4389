"""Hidden tests (generated)."""


def test_parse_pairs_0():
    from vivid_harbor.parse import parse_pairs
    assert parse_pairs('x=1| y = two |') == {'x': '1', 'y': 'two'}


def test_parse_pairs_1():
    from vivid_harbor.parse import parse_pairs
    assert parse_pairs('k=v=w||a=b') == {'k': 'v=w', 'a': 'b'}


def test_median_0():
    from vivid_harbor.parse import median
    assert median([11, 19, 6, 11, 10]) == 11.0


def test_median_1():
    from vivid_harbor.parse import median
    assert median([16, 17, 2, 7]) == 11.5
