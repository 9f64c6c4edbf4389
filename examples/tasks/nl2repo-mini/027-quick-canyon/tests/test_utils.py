"""Hidden tests (generated)."""


def test_long_words_0():
    from quick_canyon.utils import long_words
    assert long_words('an agent trains on extremely long executions') == ['trains', 'extremely', 'executions']


def test_long_words_1():
    from quick_canyon.utils import long_words
    assert long_words('tiny') == []


def test_to_bits_0():
    from quick_canyon.utils import to_bits
    assert to_bits(6) == '0110'


def test_to_bits_1():
    from quick_canyon.utils import to_bits
    assert to_bits(0) == '0000'
