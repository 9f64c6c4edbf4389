"""Hidden tests (generated)."""


def test_count_vowels_0():
    from solar_maple.strings import count_vowels
    assert count_vowels('sky') == 0


def test_count_vowels_1():
    from solar_maple.strings import count_vowels
    assert count_vowels('Banana') == 3


def test_word_counts_0():
    from solar_maple.strings import word_counts
    assert word_counts('a b a c b a') == {'a': 3, 'b': 2, 'c': 1}


def test_word_counts_1():
    from solar_maple.strings import word_counts
    assert word_counts('to be or not to be') == {'to': 2, 'be': 2, 'or': 1, 'not': 1}
