"""Hidden tests (generated)."""


def test_running_sum_0():
    from solar_harbor.lists import running_sum
    assert running_sum([3, 3, 0, 2, 3, 2]) == [3, 6, 6, 8, 11, 13]


def test_running_sum_1():
    from solar_harbor.lists import running_sum
    assert running_sum([]) == []


def test_flatten_0():
    from solar_harbor.lists import flatten
    assert flatten([1, [2, [3, 4]], 5]) == [1, 2, 3, 4, 5]


def test_flatten_1():
    from solar_harbor.lists import flatten
    assert flatten([[], ['a'], [['b']]]) == ['a', 'b']
