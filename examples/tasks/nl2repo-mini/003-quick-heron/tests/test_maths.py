"""Hidden tests (generated)."""


def test_shift_letters_0():
    from quick_heron.maths import shift_letters
    assert shift_letters('hello world') == 'byffi qilfx'


def test_shift_letters_1():
    from quick_heron.maths import shift_letters
    assert shift_letters('xyz-ABC') == 'rst-ABC'


def test_gcd_0():
    from quick_heron.maths import gcd
    assert gcd(588, 360) == 12


def test_gcd_1():
    from quick_heron.maths import gcd
    assert gcd(0, 9) == 9
