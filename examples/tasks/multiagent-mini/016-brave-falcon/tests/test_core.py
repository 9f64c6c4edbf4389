"""Hidden tests (generated)."""


def test_count_vowels_0():
    from brave_falcon.core import count_vowels
    assert count_vowels('Banana') == 3


def test_count_vowels_1():
    from brave_falcon.core import count_vowels
    assert count_vowels('Programming') == 3


def test_primes_below_0():
    from brave_falcon.core import primes_below
    assert primes_below(58) == [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53]


def test_primes_below_1():
    from brave_falcon.core import primes_below
    assert primes_below(2) == []
