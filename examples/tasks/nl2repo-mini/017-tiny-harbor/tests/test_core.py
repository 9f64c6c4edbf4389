"""Hidden tests (generated)."""


def test_rotate_0():
    from tiny_harbor.core import rotate
    assert rotate([0, 1, 2, 3, 4, 5]) == [2, 3, 4, 5, 0, 1]


def test_rotate_1():
    from tiny_harbor.core import rotate
    assert rotate(['a', 'b']) == ['a', 'b']


def test_chunks_0():
    from tiny_harbor.core import chunks
    assert chunks([0, 1, 2, 3, 4, 5, 6]) == [[0, 1], [2, 3], [4, 5], [6]]


def test_chunks_1():
    from tiny_harbor.core import chunks
    assert chunks([]) == []
