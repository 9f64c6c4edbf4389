"""Hidden tests (generated)."""


def test_word_counts_0():
    from vivid_comet.parse import word_counts
    assert word_counts('a b a c b a') == {'a': 3, 'b': 2, 'c': 1}


def test_word_counts_1():
    from vivid_comet.parse import word_counts
    assert word_counts('the cat and the hat') == {'the': 2, 'cat': 1, 'and': 1, 'hat': 1}
