"""Hidden tests (generated)."""


def test_shift_letters_0():
    from amber_ember.numbers import shift_letters
    assert shift_letters('hello world') == 'ebiil tloia'


def test_shift_letters_1():
    from amber_ember.numbers import shift_letters
    assert shift_letters('xyz-ABC') == 'uvw-ABC'


def test_running_sum_0():
    from amber_ember.numbers import running_sum
    assert running_sum([4, 1, -1, -9, -6, -2]) == [4, 5, 4, -5, -11, -13]


def test_running_sum_1():
    from amber_ember.numbers import running_sum
    assert running_sum([]) == []
