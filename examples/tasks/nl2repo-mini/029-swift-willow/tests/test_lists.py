"""Hidden tests (generated)."""


def test_to_bits_0():
    from swift_willow.lists import to_bits
    assert to_bits(66) == '01000010'


def test_to_bits_1():
    from swift_willow.lists import to_bits
    assert to_bits(0) == '00000000'


def test_is_palindrome_0():
    from swift_willow.lists import is_palindrome
    assert is_palindrome('A man, a plan, a canal: Panama') == True


def test_is_palindrome_1():
    from swift_willow.lists import is_palindrome
    assert is_palindrome('abca') == False
