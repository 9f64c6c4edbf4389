"""Hidden tests (generated)."""


def test_transpose_0():
    from lunar_falcon.maths import transpose
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_transpose_1():
    from lunar_falcon.maths import transpose
    assert transpose([[6]]) == [[6]]


def test_running_sum_0():
    from lunar_falcon.maths import running_sum
    assert running_sum([4, 6, -8, 1, -8, 2]) == [4, 10, 2, 3, -5, -3]


def test_running_sum_1():
    from lunar_falcon.maths import running_sum
    assert running_sum([]) == []
