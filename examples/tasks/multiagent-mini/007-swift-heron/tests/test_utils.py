"""Hidden tests (generated)."""


def test_rotate_0():
    from swift_heron.utils import rotate
    assert rotate([0, 1, 2, 3, 4, 5]) == [3, 4, 5, 0, 1, 2]


def test_rotate_1():
    from swift_heron.utils import rotate
    assert rotate(['a', 'b']) == ['b', 'a']


def test_to_bits_0():
    from swift_heron.utils import to_bits
    assert to_bits(11) == '1011'


def test_to_bits_1():
    from swift_heron.utils import to_bits
    assert to_bits(0) == '0000'
