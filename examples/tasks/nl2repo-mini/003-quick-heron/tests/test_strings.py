"""Hidden tests (generated)."""


def test_rotate_0():
    from quick_heron.strings import rotate
    assert rotate([0, 1, 2, 3, 4, 5]) == [3, 4, 5, 0, 1, 2]


def test_rotate_1():
    from quick_heron.strings import rotate
    assert rotate(['a', 'b']) == ['b', 'a']
