"""Hidden tests (generated)."""


def test_long_words_0():
    from swift_willow.strings import long_words
    assert long_words('an agent trains on extremely long executions') == ['trains', 'extremely', 'executions']


def test_long_words_1():
    from swift_willow.strings import long_words
    assert long_words('tiny') == []


def test_dedupe_0():
    from swift_willow.strings import dedupe
    assert dedupe([5, 2, 0, 5, 1, 4, 3, 0, 5, 0]) == [5, 2, 0, 1, 4, 3]


def test_dedupe_1():
    from swift_willow.strings import dedupe
    assert dedupe(['m', 'i', 's', 's', 'i', 's', 's', 'i', 'p', 'p', 'i']) == ['m', 'i', 's', 'p']
