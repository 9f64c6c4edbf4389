"""Hidden tests (generated)."""


def test_dedupe_0():
    from misty_quartz.text import dedupe
    assert dedupe([2, 1, 3, 2, 0, 4, 2, 4, 0, 1]) == [2, 1, 3, 0, 4]


def test_dedupe_1():
    from misty_quartz.text import dedupe
    assert dedupe(['m', 'i', 's', 's', 'i', 's', 's', 'i', 'p', 'p', 'i']) == ['m', 'i', 's', 'p']


def test_shift_letters_0():
    from misty_quartz.text import shift_letters
    assert shift_letters('hello world') == 'yvccf nficu'


def test_shift_letters_1():
    from misty_quartz.text import shift_letters
    assert shift_letters('xyz-ABC') == 'opq-ABC'
