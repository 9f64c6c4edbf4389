"""Hidden tests (generated)."""


def test_chunks_0():
    from noble_comet.strings import chunks
    assert chunks([0, 1, 2, 3, 4, 5, 6, 7, 8]) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_chunks_1():
    from noble_comet.strings import chunks
    assert chunks([]) == []


def test_is_palindrome_0():
    from noble_comet.strings import is_palindrome
    assert is_palindrome('Hello') == False


def test_is_palindrome_1():
    from noble_comet.strings import is_palindrome
    assert is_palindrome('A man, a plan, a canal: Panama') == True
