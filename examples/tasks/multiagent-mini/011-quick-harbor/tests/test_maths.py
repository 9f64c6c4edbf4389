"""Hidden tests (generated)."""


def test_shift_letters_0():
    from quick_harbor.maths import shift_letters
    assert shift_letters('hello world') == 'yvccf nficu'


def test_shift_letters_1():
    from quick_harbor.maths import shift_letters
    assert shift_letters('xyz-ABC') == 'opq-ABC'


def test_primes_below_0():
    from quick_harbor.maths import primes_below
    assert primes_below(17) == [2, 3, 5, 7, 11, 13]


def test_primes_below_1():
    from quick_harbor.maths import primes_below
    assert primes_below(2) == []
