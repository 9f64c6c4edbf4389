"""Hidden tests (generated)."""


def test_add_99_0():
    from swift_heron.text import add_99
    assert add_99(36) == 135


def test_add_99_1():
    from swift_heron.text import add_99
    assert add_99(576) == 675


def test_long_words_0():
    from swift_heron.text import long_words
    assert long_words('an agent trains on extremely long executions') == ['agent', 'trains', 'extremely', 'long', 'executions']


def test_long_words_1():
    from swift_heron.text import long_words
    assert long_words('tiny') == ['tiny']
