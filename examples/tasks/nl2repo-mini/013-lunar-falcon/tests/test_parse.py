"""Hidden tests (generated)."""


def test_digit_sum_0():
    from lunar_falcon.parse import digit_sum
    assert digit_sum(95561) == 26


def test_digit_sum_1():
    from lunar_falcon.parse import digit_sum
    assert digit_sum(-29) == 11


def test_fizzbuzz_0():
    from lunar_falcon.parse import fizzbuzz
    assert fizzbuzz(8) == ['1', '2', 'Foo', '4', 'Bar', 'Foo', '7', '8']


def test_fizzbuzz_1():
    from lunar_falcon.parse import fizzbuzz
    assert fizzbuzz(20) == ['1', '2', 'Foo', '4', 'Bar', 'Foo', '7', '8', 'Foo', 'Bar', '11', 'Foo', '13', '14', 'FooBar', '16', '17', 'Foo', '19', 'Bar']
