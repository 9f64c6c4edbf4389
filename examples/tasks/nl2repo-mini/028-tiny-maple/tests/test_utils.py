"""Hidden tests (generated)."""


def test_to_bits_0():
    from tiny_maple.utils import to_bits
    assert to_bits(54) == '00110110'


def test_to_bits_1():
    from tiny_maple.utils import to_bits
    assert to_bits(0) == '00000000'
