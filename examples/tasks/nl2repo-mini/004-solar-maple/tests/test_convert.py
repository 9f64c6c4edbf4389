"""Hidden tests (generated)."""


def test_clamp_0():
    from solar_maple.convert import clamp
    assert clamp(-22) == -17


def test_clamp_1():
    from solar_maple.convert import clamp
    assert clamp(7) == 4


def test_clamp_2():
    from solar_maple.convert import clamp
    assert clamp(-7) == -7


def test_is_palindrome_0():
    from solar_maple.convert import is_palindrome
    assert is_palindrome('Was it a car or a cat I saw') == True


def test_is_palindrome_1():
    from solar_maple.convert import is_palindrome
    assert is_palindrome('No lemon, no melon') == True
