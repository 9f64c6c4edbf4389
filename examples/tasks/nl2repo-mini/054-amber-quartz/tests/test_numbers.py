"""Hidden tests (generated)."""


def test_rotate_0():
    from amber_quartz.numbers import rotate
    assert rotate([0, 1, 2, 3, 4, 5]) == [1, 2, 3, 4, 5, 0]


def test_rotate_1():
    from amber_quartz.numbers import rotate
    assert rotate(['a', 'b']) == ['b', 'a']


def test_to_roman_0():
    from amber_quartz.numbers import to_roman
    assert to_roman(50) == 'L'


def test_to_roman_1():
    from amber_quartz.numbers import to_roman
    assert to_roman(1713) == 'MDCCXIII'
