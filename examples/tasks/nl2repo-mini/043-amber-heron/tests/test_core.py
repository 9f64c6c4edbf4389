"""Hidden tests (generated)."""


def test_add_32_0():
    from amber_heron.core import add_32
    assert add_32(42) == 74


def test_add_32_1():
    from amber_heron.core import add_32
    assert add_32(698) == 730


def test_transpose_0():
    from amber_heron.core import transpose
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_transpose_1():
    from amber_heron.core import transpose
    assert transpose([[1]]) == [[1]]
