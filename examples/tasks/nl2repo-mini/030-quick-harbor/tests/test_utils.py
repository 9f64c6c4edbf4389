"""Hidden tests (generated)."""


def test_chunks_0():
    from quick_harbor.utils import chunks
    assert chunks([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_chunks_1():
    from quick_harbor.utils import chunks
    assert chunks([]) == []


def test_primes_below_0():
    from quick_harbor.utils import primes_below
    assert primes_below(18) == [2, 3, 5, 7, 11, 13, 17]


def test_primes_below_1():
    from quick_harbor.utils import primes_below
    assert primes_below(2) == []
