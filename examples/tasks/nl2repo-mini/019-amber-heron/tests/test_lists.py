"""Hidden tests (generated)."""


def test_shift_letters_0():
    from amber_heron.lists import shift_letters
    assert shift_letters('hello world') == 'spwwz hzcwo'


def test_shift_letters_1():
    from amber_heron.lists import shift_letters
    assert shift_letters('xyz-ABC') == 'ijk-ABC'


def test_dedupe_0():
    from amber_heron.lists import dedupe
    assert dedupe([5, 2, 5, 4, 4, 3, 1, 0, 0, 0]) == [5, 2, 4, 3, 1, 0]


def test_dedupe_1():
    from amber_heron.lists import dedupe
    assert dedupe(['m', 'i', 's', 's', 'i', 's', 's', 'i', 'p', 'p', 'i']) == ['m', 'i', 's', 'p']
