"""Hidden tests (generated)."""


def test_flatten_0():
    from swift_canyon.core import flatten
    assert flatten([1, [2, [3, 4]], 5]) == [1, 2, 3, 4, 5]


def test_flatten_1():
    from swift_canyon.core import flatten
    assert flatten([[], ['a'], [['b']]]) == ['a', 'b']


def test_running_sum_0():
    from swift_canyon.core import running_sum
    assert running_sum([5, -3, 8, 1, 2, 3]) == [5, 2, 10, 11, 13, 16]


def test_running_sum_1():
    from swift_canyon.core import running_sum
    assert running_sum([]) == []
