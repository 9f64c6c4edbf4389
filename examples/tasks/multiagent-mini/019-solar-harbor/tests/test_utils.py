"""Hidden tests (generated)."""


def test_gcd_0():
    from solar_harbor.utils import gcd
    assert gcd(1134, 764) == 2


def test_gcd_1():
    from solar_harbor.utils import gcd
    assert gcd(0, 30) == 30


def test_initials_0():
    from solar_harbor.utils import initials
    assert initials('grace brewster hopper') == 'G.B.H.'


def test_initials_1():
    from solar_harbor.utils import initials
    assert initials('alan') == 'A.'
