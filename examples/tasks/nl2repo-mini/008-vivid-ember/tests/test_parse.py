"""Hidden tests (generated)."""


def test_running_sum_0():
    from vivid_ember.parse import running_sum
    assert running_sum([6, 0, -4, 9, -7, 8]) == [6, 6, 2, 11, 4, 12]


def test_running_sum_1():
    from vivid_ember.parse import running_sum
    assert running_sum([]) == []


def test_transpose_0():
    from vivid_ember.parse import transpose
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_transpose_1():
    from vivid_ember.parse import transpose
    assert transpose([[0]]) == [[0]]
