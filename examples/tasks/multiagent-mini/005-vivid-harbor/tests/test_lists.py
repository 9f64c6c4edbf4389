"""Hidden tests (generated)."""


def test_clamp_0():
    from vivid_harbor.lists import clamp
    assert clamp(-6) == -1


def test_clamp_1():
    from vivid_harbor.lists import clamp
    assert clamp(10) == 7


def test_clamp_2():
    from vivid_harbor.lists import clamp
    assert clamp(3) == 3


def test_primes_below_0():
    from vivid_harbor.lists import primes_below
    assert primes_below(22) == [2, 3, 5, 7, 11, 13, 17, 19]


def test_primes_below_1():
    from vivid_harbor.lists import primes_below
    assert primes_below(2) == []
