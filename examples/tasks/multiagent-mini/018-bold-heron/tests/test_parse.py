"""Hidden tests (generated)."""


def test_long_words_0():
    from bold_heron.parse import long_words
    assert long_words('an agent trains on extremely long executions') == ['trains', 'extremely', 'executions']


def test_long_words_1():
    from bold_heron.parse import long_words
    assert long_words('tiny') == []


def test_rotate_0():
    from bold_heron.parse import rotate
    assert rotate([0, 1, 2, 3, 4, 5]) == [1, 2, 3, 4, 5, 0]


def test_rotate_1():
    from bold_heron.parse import rotate
    assert rotate(['a', 'b']) == ['b', 'a']
