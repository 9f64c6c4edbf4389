"""Hidden tests (generated)."""


def test_shift_letters_0():
    from solar_meadow.convert import shift_letters
    assert shift_letters('hello world') == 'jgnnq yqtnf'


def test_shift_letters_1():
    from solar_meadow.convert import shift_letters
    assert shift_letters('xyz-ABC') == 'zab-ABC'


def test_word_counts_0():
    from solar_meadow.convert import word_counts
    assert word_counts('One one ONE two') == {'one': 3, 'two': 1}


def test_word_counts_1():
    from solar_meadow.convert import word_counts
    assert word_counts('a b a c b a') == {'a': 3, 'b': 2, 'c': 1}
