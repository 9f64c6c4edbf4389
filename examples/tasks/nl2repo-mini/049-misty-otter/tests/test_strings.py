"""Hidden tests (generated)."""


def test_clamp_0():
    from misty_otter.strings import clamp
    assert clamp(-20) == -15


def test_clamp_1():
    from misty_otter.strings import clamp
    assert clamp(26) == 23


def test_clamp_2():
    from misty_otter.strings import clamp
    assert clamp(4) == 4


def test_median_0():
    from misty_otter.strings import median
    assert median([11, 20, 7, 9, 6]) == 9.0


def test_median_1():
    from misty_otter.strings import median
    assert median([14, 0, 13, 6]) == 9.5
