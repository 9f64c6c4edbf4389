"""Hidden tests (generated)."""


def test_seq_term_0():
    from brave_falcon.strings import seq_term
    assert seq_term(1) == 1


def test_seq_term_1():
    from brave_falcon.strings import seq_term
    assert seq_term(24) == 46368


def test_word_counts_0():
    from brave_falcon.strings import word_counts
    assert word_counts('the cat and the hat') == {'the': 2, 'cat': 1, 'and': 1, 'hat': 1}


def test_word_counts_1():
    from brave_falcon.strings import word_counts
    assert word_counts('One one ONE two') == {'one': 3, 'two': 1}
