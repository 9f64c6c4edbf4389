"""Hidden tests (generated)."""


def test_long_words_0():
    from amber_ember.numbers import long_words
    assert long_words('an agent trains on extremely long executions') == ['agent', 'trains', 'extremely', 'executions']


def test_long_words_1():
    from amber_ember.numbers import long_words
    assert long_words('tiny') == []


def test_transpose_0():
    from amber_ember.numbers import transpose
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_transpose_1():
    from amber_ember.numbers import transpose
    assert transpose([[1]]) == [[1]]
