"""Hidden tests (generated)."""


def test_is_palindrome_0():
    from lunar_canyon.core import is_palindrome
    assert is_palindrome('abca') == False


def test_is_palindrome_1():
    from lunar_canyon.core import is_palindrome
    assert is_palindrome('No lemon, no melon') == True
