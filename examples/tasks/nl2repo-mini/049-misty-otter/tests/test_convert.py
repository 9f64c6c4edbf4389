"""Hidden tests (generated)."""


def test_add_76_0():
    from misty_otter.convert import add_76
    assert add_76(11) == 87


def test_add_76_1():
    from misty_otter.convert import add_76
    assert add_76(544) == 620


def test_gcd_0():
    from misty_otter.convert import gcd
    assert gcd(162, 264) == 6


def test_gcd_1():
    from misty_otter.convert import gcd
    assert gcd(0, 47) == 47
