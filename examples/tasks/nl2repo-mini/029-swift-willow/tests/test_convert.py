"""Hidden tests (generated)."""


def test_shift_letters_0():
    from swift_willow.convert import shift_letters
    assert shift_letters('hello world') == 'khoor zruog'


def test_shift_letters_1():
    from swift_willow.convert import shift_letters
    assert shift_letters('xyz-ABC') == 'abc-ABC'


def test_word_counts_0():
    from swift_willow.convert import word_counts
    assert word_counts('One one ONE two') == {'one': 3, 'two': 1}


def test_word_counts_1():
    from swift_willow.convert import word_counts
    assert word_counts('a b a c b a') == {'a': 3, 'b': 2, 'c': 1}
