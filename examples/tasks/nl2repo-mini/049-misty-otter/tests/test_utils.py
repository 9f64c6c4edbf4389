"""Hidden tests (generated)."""


def test_long_words_0():
    from misty_otter.utils import long_words
    assert long_words('an agent trains on extremely long executions') == ['agent', 'trains', 'extremely', 'long', 'executions']


def test_long_words_1():
    from misty_otter.utils import long_words
    assert long_words('tiny') == ['tiny']


def test_chunks_0():
    from misty_otter.utils import chunks
    assert chunks([0, 1, 2, 3, 4, 5]) == [[0, 1], [2, 3], [4, 5]]


def test_chunks_1():
    from misty_otter.utils import chunks
    assert chunks([]) == []
