"""Hidden tests (generated)."""


def test_primes_below_0():
    from amber_harbor.seqs import primes_below
    assert primes_below(59) == [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53]


def test_primes_below_1():
    from amber_harbor.seqs import primes_below
    assert primes_below(2) == []


def test_running_sum_0():
    from amber_harbor.seqs import running_sum
    assert running_sum([8, 3, 7, 2, -4, -6]) == [8, 11, 18, 20, 16, 10]


def test_running_sum_1():
    from amber_harbor.seqs import running_sum
    assert running_sum([]) == []
