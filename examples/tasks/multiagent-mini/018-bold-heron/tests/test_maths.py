"""Hidden tests (generated)."""


def test_initials_0():
    from bold_heron.maths import initials
    assert initials('grace brewster hopper') == 'G.B.H.'


def test_initials_1():
    from bold_heron.maths import initials
    assert initials('alan') == 'A.'


def test_gcd_0():
    from bold_heron.maths import gcd
    assert gcd(420, 60) == 60


def test_gcd_1():
    from bold_heron.maths import gcd
    assert gcd(0, 41) == 41
