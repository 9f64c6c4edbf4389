"""Hidden tests (generated)."""


def test_count_vowels_0():
    from noble_heron.seqs import count_vowels
    assert count_vowels('AEIOUxyz') == 5


def test_count_vowels_1():
    from noble_heron.seqs import count_vowels
    assert count_vowels('rhythm') == 0


def test_shift_letters_0():
    from noble_heron.seqs import shift_letters
    assert shift_letters('hello world') == 'khoor zruog'


def test_shift_letters_1():
    from noble_heron.seqs import shift_letters
    assert shift_letters('xyz-ABC') == 'abc-ABC'
