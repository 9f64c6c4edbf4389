"""Hidden tests (generated)."""


def test_rotate_0():
    from calm_willow.strings import rotate
    assert rotate([0, 1, 2, 3, 4, 5]) == [2, 3, 4, 5, 0, 1]


def test_rotate_1():
    from calm_willow.strings import rotate
    assert rotate(['a', 'b']) == ['a', 'b']


def test_running_sum_0():
    from calm_willow.strings import running_sum
    assert running_sum([2, -3, -4, -1, 1, 1]) == [2, -1, -5, -6, -5, -4]


def test_running_sum_1():
    from calm_willow.strings import running_sum
    assert running_sum([]) == []
