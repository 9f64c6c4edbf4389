"""Hidden tests (generated)."""


def test_flatten_0():
    from vivid_harbor.text import flatten
    assert flatten([1, [2, [3, 4]], 5]) == [1, 2, 3, 4, 5]


def test_flatten_1():
    from vivid_harbor.text import flatten
    assert flatten([[], ['a'], [['b']]]) == ['a', 'b']


def test_rotate_0():
    from vivid_harbor.text import rotate
    assert rotate([0, 1, 2, 3, 4, 5]) == [1, 2, 3, 4, 5, 0]


def test_rotate_1():
    from vivid_harbor.text import rotate
    assert rotate(['a', 'b']) == ['b', 'a']
