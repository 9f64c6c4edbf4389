"""Hidden tests (generated)."""


def test_transpose_0():
    from noble_willow.utils import transpose
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_transpose_1():
    from noble_willow.utils import transpose
    assert transpose([[2]]) == [[2]]


def test_rotate_0():
    from noble_willow.utils import rotate
    assert rotate([0, 1, 2, 3, 4, 5]) == [3, 4, 5, 0, 1, 2]


def test_rotate_1():
    from noble_willow.utils import rotate
    assert rotate(['a', 'b']) == ['b', 'a']
