"""Hidden tests (generated)."""


def test_to_roman_0():
    from brave_quartz.strings import to_roman
    assert to_roman(10) == 'X'


def test_to_roman_1():
    from brave_quartz.strings import to_roman
    assert to_roman(1206) == 'MCCVI'


def test_rotate_0():
    from brave_quartz.strings import rotate
    assert rotate([0, 1, 2, 3, 4, 5]) == [2, 3, 4, 5, 0, 1]


def test_rotate_1():
    from brave_quartz.strings import rotate
    assert rotate(['a', 'b']) == ['a', 'b']
