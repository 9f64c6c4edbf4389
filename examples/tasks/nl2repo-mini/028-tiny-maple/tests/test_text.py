"""Hidden tests (generated)."""


def test_median_0():
    from tiny_maple.text import median
    assert median([15, 16, 10, 18, 15]) == 15.0


def test_median_1():
    from tiny_maple.text import median
    assert median([10, 7, 9, 14]) == 9.5


def test_clamp_0():
    from tiny_maple.text import clamp
    assert clamp(-18) == -13


def test_clamp_1():
    from tiny_maple.text import clamp
    assert clamp(20) == 17


def test_clamp_2():
    from tiny_maple.text import clamp
    assert clamp(2) == 2
