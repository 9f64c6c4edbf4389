"""Hidden tests (generated)."""


def test_word_counts_0():
    from solar_harbor.core import word_counts
    assert word_counts('One one ONE two') == {'one': 3, 'two': 1}


def test_word_counts_1():
    from solar_harbor.core import word_counts
    assert word_counts('the cat and the hat') == {'the': 2, 'cat': 1, 'and': 1, 'hat': 1}


def test_count_vowels_0():
    from solar_harbor.core import count_vowels
    assert count_vowels('rhythm') == 0


def test_count_vowels_1():
    from solar_harbor.core import count_vowels
    assert count_vowels('Programming') == 3
