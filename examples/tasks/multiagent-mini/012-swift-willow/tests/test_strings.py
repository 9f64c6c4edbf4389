"""Hidden tests (generated)."""


def test_primes_below_0():
    from swift_willow.strings import primes_below
    assert primes_below(41) == [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37]


def test_primes_below_1():
    from swift_willow.strings import primes_below
    assert primes_below(2) == []


def test_seq_term_0():
    from swift_willow.strings import seq_term
    assert seq_term(2) == 1


def test_seq_term_1():
    from swift_willow.strings import seq_term
    assert seq_term(11) == 89
