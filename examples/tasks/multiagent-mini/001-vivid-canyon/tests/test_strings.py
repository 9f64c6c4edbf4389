"""Hidden tests (generated)."""


def test_running_sum_0():
    from vivid_canyon.strings import running_sum
    assert running_sum([-9, -4, -3, 5, 3, 2]) == [-9, -13, -16, -11, -8, -6]


def test_running_sum_1():
    from vivid_canyon.strings import running_sum
    assert running_sum([]) == []


def test_fizzbuzz_0():
    from vivid_canyon.strings import fizzbuzz
    assert fizzbuzz(6) == ['1', '2', '3', 'Fizz', '5', 'Buzz']


def test_fizzbuzz_1():
    from vivid_canyon.strings import fizzbuzz
    assert fizzbuzz(28) == ['1', '2', '3', 'Fizz', '5', 'Buzz', '7', 'Fizz', '9', '10', '11', 'FizzBuzz', '13', '14', '15', 'Fizz', '17', 'Buzz', '19', 'Fizz', '21', '22', '23', 'FizzBuzz', '25', '26', '27', 'Fizz']
