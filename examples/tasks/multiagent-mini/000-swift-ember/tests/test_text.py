"""Hidden tests (generated)."""


def test_long_words_0():
    from swift_ember.text import long_words
    assert long_words('an agent trains on extremely long executions') == ['trains', 'extremely', 'executions']


def test_long_words_1():
    from swift_ember.text import long_words
    assert long_words('tiny') == []


def test_count_vowels_0():
    from swift_ember.text import count_vowels
    assert count_vowels('AEIOUxyz') == 5


def test_count_vowels_1():
    from swift_ember.text import count_vowels
    assert count_vowels('queue') == 4
