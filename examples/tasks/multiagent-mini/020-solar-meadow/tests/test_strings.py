"""Hidden tests (generated)."""


def test_is_palindrome_0():
    from solar_meadow.strings import is_palindrome
    assert is_palindrome('Hello') == False


def test_is_palindrome_1():
    from solar_meadow.strings import is_palindrome
    assert is_palindrome('Was it a car or a cat I saw') == True


def test_slugify_0():
    from solar_meadow.strings import slugify
    assert slugify('Hello, World!') == 'hello-world'


def test_slugify_1():
    from solar_meadow.strings import slugify
    assert slugify('  Ultra--Long  Horizon 2026 ') == 'ultra-long-horizon-2026'
