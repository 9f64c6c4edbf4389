"""Hidden tests (generated)."""


def test_seq_term_0():
    from brave_meadow.utils import seq_term
    assert seq_term(1) == 1


def test_seq_term_1():
    from brave_meadow.utils import seq_term
    assert seq_term(18) == 5778


def test_long_words_0():
    from brave_meadow.utils import long_words
    assert long_words('an agent trains on extremely long executions') == ['agent', 'trains', 'extremely', 'long', 'executions']


def test_long_words_1():
    from brave_meadow.utils import long_words
    assert long_words('tiny') == ['tiny']
