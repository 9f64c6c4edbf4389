"""Hidden tests (generated)."""


def test_fizzbuzz_0():
    from bold_ember.core import fizzbuzz
    assert fizzbuzz(7) == ['1', 'Fizz', '3', 'Fizz', '5', 'Fizz', 'Buzz']


def test_fizzbuzz_1():
    from bold_ember.core import fizzbuzz
    assert fizzbuzz(18) == ['1', 'Fizz', '3', 'Fizz', '5', 'Fizz', 'Buzz', 'Fizz', '9', 'Fizz', '11', 'Fizz', '13', 'FizzBuzz', '15', 'Fizz', '17', 'Fizz']
