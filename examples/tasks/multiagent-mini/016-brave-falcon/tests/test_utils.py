"""Hidden tests (generated)."""


def test_gcd_0():
    from brave_falcon.utils import gcd
    assert gcd(222, 588) == 6


def test_gcd_1():
    from brave_falcon.utils import gcd
    assert gcd(0, 19) == 19


def test_rotate_0():
    from brave_falcon.utils import rotate
    assert rotate([0, 1, 2, 3, 4, 5]) == [2, 3, 4, 5, 0, 1]


def test_rotate_1():
    from brave_falcon.utils import rotate
    assert rotate(['a', 'b']) == ['a', 'b']
