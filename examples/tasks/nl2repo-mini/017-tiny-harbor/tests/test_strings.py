"""Hidden tests (generated)."""


def test_initials_0():
    from tiny_harbor.strings import initials
    assert initials('grace brewster hopper') == 'G.B.H.'


def test_initials_1():
    from tiny_harbor.strings import initials
    assert initials('alan') == 'A.'


def test_long_words_0():
    from tiny_harbor.strings import long_words
    assert long_words('an agent trains on extremely long executions') == ['agent', 'trains', 'extremely', 'executions']


def test_long_words_1():
    from tiny_harbor.strings import long_words
    assert long_words('tiny') == []
