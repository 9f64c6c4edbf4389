"""Hidden tests (generated)."""


def test_is_palindrome_0():
    from vivid_canyon.core import is_palindrome
    assert is_palindrome('A man, a plan, a canal: Panama') == True


def test_is_palindrome_1():
    from vivid_canyon.core import is_palindrome
    assert is_palindrome('abca') == False
