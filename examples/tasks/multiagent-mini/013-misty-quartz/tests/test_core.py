"""Hidden tests (generated)."""


def test_to_bits_0():
    from misty_quartz.core import to_bits
    assert to_bits(225) == '11100001'


def test_to_bits_1():
    from misty_quartz.core import to_bits
    assert to_bits(0) == '00000000'


def test_chunks_0():
    from misty_quartz.core import chunks
    assert chunks([0, 1, 2, 3, 4]) == [[0, 1, 2], [3, 4]]


def test_chunks_1():
    from misty_quartz.core import chunks
    assert chunks([]) == []
