"""Hidden tests (generated)."""


def test_to_bits_0():
    from tiny_canyon.lists import to_bits
    assert to_bits(17) == '00010001'


def test_to_bits_1():
    from tiny_canyon.lists import to_bits
    assert to_bits(0) == '00000000'


def test_rotate_0():
    from tiny_canyon.lists import rotate
    assert rotate([0, 1, 2, 3, 4, 5]) == [3, 4, 5, 0, 1, 2]


def test_rotate_1():
    from tiny_canyon.lists import rotate
    assert rotate(['a', 'b']) == ['b', 'a']
