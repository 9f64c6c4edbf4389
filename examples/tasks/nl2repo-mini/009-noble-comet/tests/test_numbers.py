"""Hidden tests (generated)."""


def test_transpose_0():
    from noble_comet.numbers import transpose
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_transpose_1():
    from noble_comet.numbers import transpose
    assert transpose([[4]]) == [[4]]


def test_clamp_0():
    from noble_comet.numbers import clamp
    assert clamp(-8) == -3


def test_clamp_1():
    from noble_comet.numbers import clamp
    assert clamp(7) == 4
