"""Hidden tests (generated)."""


def test_median_0():
    from quick_heron.core import median
    assert median([6, 16, 13, 17, 11]) == 13.0


def test_median_1():
    from quick_heron.core import median
    assert median([5, 1, 8, 5]) == 5.0


def test_digit_sum_0():
    from quick_heron.core import digit_sum
    assert digit_sum(64834) == 25


def test_digit_sum_1():
    from quick_heron.core import digit_sum
    assert digit_sum(-28) == 10
