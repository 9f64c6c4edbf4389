"""Hidden tests (generated)."""


def test_transpose_0():
    from amber_heron.seqs import transpose
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_transpose_1():
    from amber_heron.seqs import transpose
    assert transpose([[4]]) == [[4]]


def test_to_bits_0():
    from amber_heron.seqs import to_bits
    assert to_bits(9) == '1001'


def test_to_bits_1():
    from amber_heron.seqs import to_bits
    assert to_bits(0) == '0000'
