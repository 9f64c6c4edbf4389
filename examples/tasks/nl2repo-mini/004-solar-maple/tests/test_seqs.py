"""Hidden tests (generated)."""


def test_shift_letters_0():
    from solar_maple.seqs import shift_letters
    assert shift_letters('hello world') == 'fcjjm umpjb'


def test_shift_letters_1():
    from solar_maple.seqs import shift_letters
    assert shift_letters('xyz-ABC') == 'vwx-ABC'


def test_dedupe_0():
    from solar_maple.seqs import dedupe
    assert dedupe([5, 3, 5, 3, 1, 5, 1, 2, 2, 3]) == [5, 3, 1, 2]


def test_dedupe_1():
    from solar_maple.seqs import dedupe
    assert dedupe(['m', 'i', 's', 's', 'i', 's', 's', 'i', 'p', 'p', 'i']) == ['m', 'i', 's', 'p']
