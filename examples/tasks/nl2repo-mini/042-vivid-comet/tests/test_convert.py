"""Hidden tests (generated)."""


def test_word_counts_0():
    from vivid_comet.convert import word_counts
    assert word_counts('a b a c b a') == {'a': 3, 'b': 2, 'c': 1}


def test_word_counts_1():
    from vivid_comet.convert import word_counts
    assert word_counts('to be or not to be') == {'to': 2, 'be': 2, 'or': 1, 'not': 1}


def test_primes_below_0():
    from vivid_comet.convert import primes_below
    assert primes_below(60) == [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59]


def test_primes_below_1():
    from vivid_comet.convert import primes_below
    assert primes_below(2) == []
