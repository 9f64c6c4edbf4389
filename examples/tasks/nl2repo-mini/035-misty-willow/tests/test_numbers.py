"""Hidden tests (generated)."""


def test_median_0():
    from misty_willow.numbers import median
    assert median([2, 18, 6, 11, 10]) == 10.0


def test_median_1():
    from misty_willow.numbers import median
    assert median([18, 7, 15, 8]) == 11.5


def test_shift_letters_0():
    from misty_willow.numbers import shift_letters
    assert shift_letters('hello world') == 'spwwz hzcwo'


def test_shift_letters_1():
    from misty_willow.numbers import shift_letters
    assert shift_letters('xyz-ABC') == 'ijk-ABC'
