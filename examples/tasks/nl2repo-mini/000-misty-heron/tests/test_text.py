"""Hidden tests (generated)."""


def test_rle_encode_0():
    from misty_heron.text import rle_encode
    assert rle_encode('aabbbbbbbbbbb') == 'a2b11'


def test_rle_encode_1():
    from misty_heron.text import rle_encode
    assert rle_encode('') == ''


def test_is_palindrome_0():
    from misty_heron.text import is_palindrome
    assert is_palindrome('Was it a car or a cat I saw') == True


def test_is_palindrome_1():
    from misty_heron.text import is_palindrome
    assert is_palindrome('Hello') == False
