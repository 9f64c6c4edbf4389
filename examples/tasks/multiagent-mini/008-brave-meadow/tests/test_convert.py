"""Hidden tests (generated)."""


def test_flatten_0():
    from brave_meadow.convert import flatten
    assert flatten([1, [2, [3, 4]], 5]) == [1, 2, 3, 4, 5]


def test_flatten_1():
    from brave_meadow.convert import flatten
    assert flatten([[], ['a'], [['b']]]) == ['a', 'b']


def test_gcd_0():
    from brave_meadow.convert import gcd
    assert gcd(372, 796) == 4


def test_gcd_1():
    from brave_meadow.convert import gcd
    assert gcd(0, 46) == 46
