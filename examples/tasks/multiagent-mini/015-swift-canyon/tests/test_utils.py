"""Hidden tests (generated)."""


def test_fizzbuzz_0():
    from swift_canyon.utils import fizzbuzz
    assert fizzbuzz(9) == ['1', '2', 'Foo', '4', '5', 'Foo', 'Bar', '8', 'Foo']


def test_fizzbuzz_1():
    from swift_canyon.utils import fizzbuzz
    assert fizzbuzz(15) == ['1', '2', 'Foo', '4', '5', 'Foo', 'Bar', '8', 'Foo', '10', '11', 'Foo', '13', 'Bar', 'Foo']


def test_rle_encode_0():
    from swift_canyon.utils import rle_encode
    assert rle_encode('aaaabbbbb') == 'a4b5'


def test_rle_encode_1():
    from swift_canyon.utils import rle_encode
    assert rle_encode('') == ''
