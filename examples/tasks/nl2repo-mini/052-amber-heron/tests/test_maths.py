"""Hidden tests (generated)."""


def test_long_words_0():
    from amber_heron.maths import long_words
    assert long_words('an agent trains on extremely long executions') == ['trains', 'extremely', 'executions']


def test_long_words_1():
    from amber_heron.maths import long_words
    assert long_words('tiny') == []


def test_running_sum_0():
    from amber_heron.maths import running_sum
    assert running_sum([-3, -6, -7, 7, 7, -8]) == [-3, -9, -16, -9, -2, -10]


def test_running_sum_1():
    from amber_heron.maths import running_sum
    assert running_sum([]) == []
