"""Hidden tests (generated)."""


def test_is_palindrome_0():
    from bold_falcon.maths import is_palindrome
    assert is_palindrome('Was it a car or a cat I saw') == True


def test_is_palindrome_1():
    from bold_falcon.maths import is_palindrome
    assert is_palindrome('abca') == False


def test_fizzbuzz_0():
    from bold_falcon.maths import fizzbuzz
    assert fizzbuzz(9) == ['1', '2', 'Foo', '4', 'Bar', 'Foo', '7', '8', 'Foo']


def test_fizzbuzz_1():
    from bold_falcon.maths import fizzbuzz
    assert fizzbuzz(14) == ['1', '2', 'Foo', '4', 'Bar', 'Foo', '7', '8', 'Foo', 'Bar', '11', 'Foo', '13', '14']
