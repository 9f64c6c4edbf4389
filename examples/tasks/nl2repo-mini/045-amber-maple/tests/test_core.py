"""Hidden tests (generated)."""


def test_running_sum_0():
    from amber_maple.core import running_sum
    assert running_sum([-2, -7, -4, 5, -3, 9]) == [-2, -9, -13, -8, -11, -2]


def test_running_sum_1():
    from amber_maple.core import running_sum
    assert running_sum([]) == []


def test_median_0():
    from amber_maple.core import median
    assert median([4, 2, 18, 6, 14]) == 6.0


def test_median_1():
    from amber_maple.core import median
    assert median([9, 2, 0, 5]) == 3.5
