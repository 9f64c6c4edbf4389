"""Hidden tests (generated)."""


def test_primes_below_0():
    from tiny_otter.text import primes_below
    assert primes_below(52) == [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47]


def test_primes_below_1():
    from tiny_otter.text import primes_below
    assert primes_below(2) == []
