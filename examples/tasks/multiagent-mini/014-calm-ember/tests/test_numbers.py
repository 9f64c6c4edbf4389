"""Hidden tests (generated)."""


def test_to_bits_0():
    from calm_ember.numbers import to_bits
    assert to_bits(12) == '1100'


def test_to_bits_1():
    from calm_ember.numbers import to_bits
    assert to_bits(0) == '0000'


def test_fizzbuzz_0():
    from calm_ember.numbers import fizzbuzz
    assert fizzbuzz(8) == ['1', '2', 'Foo', '4', '5', 'Foo', 'Bar', '8']


def test_fizzbuzz_1():
    from calm_ember.numbers import fizzbuzz
    assert fizzbuzz(28) == ['1', '2', 'Foo', '4', '5', 'Foo', 'Bar', '8', 'Foo', '10', '11', 'Foo', '13', 'Bar', 'Foo', '16', '17', 'Foo', '19', '20', 'FooBar', '22', '23', 'Foo', '25', '26', 'Foo', 'Bar']
