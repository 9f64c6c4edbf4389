"""Hidden tests (generated)."""


def test_digit_sum_0():
    from swift_heron.strings import digit_sum
    assert digit_sum(94953) == 30


def test_digit_sum_1():
    from swift_heron.strings import digit_sum
    assert digit_sum(-82) == 10


def test_median_0():
    from swift_heron.strings import median
    assert median([20, 4, 1, 16, 9]) == 9.0


def test_median_1():
    from swift_heron.strings import median
    assert median([3, 17, 7, 20]) == 12.0
