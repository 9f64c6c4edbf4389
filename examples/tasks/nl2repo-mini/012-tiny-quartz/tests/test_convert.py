"""Hidden tests (generated)."""


def test_is_palindrome_0():
    from tiny_quartz.convert import is_palindrome
    assert is_palindrome('A man, a plan, a canal: Panama') == True


def test_is_palindrome_1():
    from tiny_quartz.convert import is_palindrome
    assert is_palindrome('abca') == False


def test_gcd_0():
    from tiny_quartz.convert import gcd
    assert gcd(810, 740) == 10


def test_gcd_1():
    from tiny_quartz.convert import gcd
    assert gcd(0, 8) == 8
