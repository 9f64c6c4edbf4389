"""Hidden tests (generated)."""


def test_primes_below_0():
    from lunar_falcon.numbers import primes_below
    assert primes_below(13) == [2, 3, 5, 7, 11]


def test_primes_below_1():
    from lunar_falcon.numbers import primes_below
    assert primes_below(2) == []


def test_gcd_0():
    from lunar_falcon.numbers import gcd
    assert gcd(570, 396) == 6


def test_gcd_1():
    from lunar_falcon.numbers import gcd
    assert gcd(0, 4) == 4
