"""Hidden tests (generated)."""


def test_is_palindrome_0():
    from tiny_canyon.maths import is_palindrome
    assert is_palindrome('No lemon, no melon') == True


def test_is_palindrome_1():
    from tiny_canyon.maths import is_palindrome
    assert is_palindrome('abca') == False


def test_primes_below_0():
    from tiny_canyon.maths import primes_below
    assert primes_below(28) == [2, 3, 5, 7, 11, 13, 17, 19, 23]


def test_primes_below_1():
    from tiny_canyon.maths import primes_below
    assert primes_below(2) == []
