"""Hidden tests (generated)."""


def test_shift_letters_0():
    from tiny_quartz.strings import shift_letters
    assert shift_letters('hello world') == 'wtaad ldgas'


def test_shift_letters_1():
    from tiny_quartz.strings import shift_letters
    assert shift_letters('xyz-ABC') == 'mno-ABC'


def test_median_0():
    from tiny_quartz.strings import median
    assert median([9, 17, 18, 14, 12]) == 14.0


def test_median_1():
    from tiny_quartz.strings import median
    assert median([0, 5, 4, 18]) == 4.5
