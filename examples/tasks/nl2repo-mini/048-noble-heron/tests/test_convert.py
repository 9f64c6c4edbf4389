"""Hidden tests (generated)."""


def test_gcd_0():
    from noble_heron.convert import gcd
    assert gcd(108, 776) == 4


def test_gcd_1():
    from noble_heron.convert import gcd
    assert gcd(0, 7) == 7
