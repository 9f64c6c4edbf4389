"""Hidden tests (generated)."""


def test_primes_below_0():
    from misty_harbor.numbers import primes_below
    assert primes_below(25) == [2, 3, 5, 7, 11, 13, 17, 19, 23]


def test_primes_below_1():
    from misty_harbor.numbers import primes_below
    assert primes_below(2) == []
