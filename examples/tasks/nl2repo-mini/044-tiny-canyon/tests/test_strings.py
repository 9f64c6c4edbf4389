"""Hidden tests (generated)."""


def test_primes_below_0():
    from tiny_canyon.strings import primes_below
    assert primes_below(42) == [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41]


def test_primes_below_1():
    from tiny_canyon.strings import primes_below
    assert primes_below(2) == []


def test_parse_pairs_0():
    from tiny_canyon.strings import parse_pairs
    assert parse_pairs('x=1, y = two ,') == {'x': '1', 'y': 'two'}


def test_parse_pairs_1():
    from tiny_canyon.strings import parse_pairs
    assert parse_pairs('k=v=w,,a=b') == {'k': 'v=w', 'a': 'b'}
