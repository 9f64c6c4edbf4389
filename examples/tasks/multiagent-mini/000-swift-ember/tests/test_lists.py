"""Hidden tests (generated)."""


def test_transpose_0():
    from swift_ember.lists import transpose
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_transpose_1():
    from swift_ember.lists import transpose
    assert transpose([[7]]) == [[7]]


def test_flatten_0():
    from swift_ember.lists import flatten
    assert flatten([1, [2, [3, 4]], 5]) == [1, 2, 3, 4, 5]


def test_flatten_1():
    from swift_ember.lists import flatten
    assert flatten([[], ['a'], [['b']]]) == ['a', 'b']
