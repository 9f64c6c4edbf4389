"""Hidden tests (generated)."""


def test_transpose_0():
    from tiny_canyon.text import transpose
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_transpose_1():
    from tiny_canyon.text import transpose
    assert transpose([[5]]) == [[5]]


def test_running_sum_0():
    from tiny_canyon.text import running_sum
    assert running_sum([-6, 8, -8, -1, -6, -5]) == [-6, 2, -6, -7, -13, -18]


def test_running_sum_1():
    from tiny_canyon.text import running_sum
    assert running_sum([]) == []
