"""Hidden tests (generated)."""


def test_gcd_0():
    from noble_heron.strings import gcd
    assert gcd(384, 340) == 4


def test_gcd_1():
    from noble_heron.strings import gcd
    assert gcd(0, 41) == 41


def test_word_counts_0():
    from noble_heron.strings import word_counts
    assert word_counts('a b a c b a') == {'a': 3, 'b': 2, 'c': 1}


def test_word_counts_1():
    from noble_heron.strings import word_counts
    assert word_counts('the cat and the hat') == {'the': 2, 'cat': 1, 'and': 1, 'hat': 1}
