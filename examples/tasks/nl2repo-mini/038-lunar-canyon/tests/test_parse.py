"""Hidden tests (generated)."""


def test_to_bits_0():
    from lunar_canyon.parse import to_bits
    assert to_bits(12) == '1100'


def test_to_bits_1():
    from lunar_canyon.parse import to_bits
    assert to_bits(0) == '0000'


def test_flatten_0():
    from lunar_canyon.parse import flatten
    assert flatten([1, [2, [3, 4]], 5]) == [1, 2, 3, 4, 5]


def test_flatten_1():
    from lunar_canyon.parse import flatten
    assert flatten([[], ['a'], [['b']]]) == ['a', 'b']
