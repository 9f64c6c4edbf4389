"""Hidden tests (generated)."""


def test_gcd_0():
    from noble_comet.convert import gcd
    assert gcd(1182, 552) == 6


def test_gcd_1():
    from noble_comet.convert import gcd
    assert gcd(0, 29) == 29


def test_parse_pairs_0():
    from noble_comet.convert import parse_pairs
    assert parse_pairs('x=1| y = two |') == {'x': '1', 'y': 'two'}


def test_parse_pairs_1():
    from noble_comet.convert import parse_pairs
    assert parse_pairs('k=v=w||a=b') == {'k': 'v=w', 'a': 'b'}
