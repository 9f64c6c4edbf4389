"""Hidden tests (generated)."""


def test_shift_letters_0():
    from tiny_comet.strings import shift_letters
    assert shift_letters('hello world') == 'byffi qilfx'


def test_shift_letters_1():
    from tiny_comet.strings import shift_letters
    assert shift_letters('xyz-ABC') == 'rst-ABC'


def test_running_sum_0():
    from tiny_comet.strings import running_sum
    assert running_sum([-4, -7, -2, 1, -2, 8]) == [-4, -11, -13, -12, -14, -6]


def test_running_sum_1():
    from tiny_comet.strings import running_sum
    assert running_sum([]) == []
