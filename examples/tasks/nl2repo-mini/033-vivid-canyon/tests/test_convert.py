"""Hidden tests (generated)."""


def test_count_vowels_0():
    from vivid_canyon.convert import count_vowels
    assert count_vowels('AEIOUxyz') == 5


def test_count_vowels_1():
    from vivid_canyon.convert import count_vowels
    assert count_vowels('rhythm') == 0


def test_gcd_0():
    from vivid_canyon.convert import gcd
    assert gcd(1062, 708) == 354


def test_gcd_1():
    from vivid_canyon.convert import gcd
    assert gcd(0, 5) == 5
