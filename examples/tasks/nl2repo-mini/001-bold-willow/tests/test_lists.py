"""Hidden tests (generated)."""


def test_rotate_0():
    from bold_willow.lists import rotate
    assert rotate([0, 1, 2, 3, 4, 5]) == [3, 4, 5, 0, 1, 2]


def test_rotate_1():
    from bold_willow.lists import rotate
    assert rotate(['a', 'b']) == ['b', 'a']


def test_to_roman_0():
    from bold_willow.lists import to_roman
    assert to_roman(36) == 'XXXVI'


def test_to_roman_1():
    from bold_willow.lists import to_roman
    assert to_roman(2688) == 'MMDCLXXXVIII'
