"""Hidden tests (generated)."""


def test_count_vowels_0():
    from noble_willow.core import count_vowels
    assert count_vowels('Programming') == 3


def test_count_vowels_1():
    from noble_willow.core import count_vowels
    assert count_vowels('Banana') == 3


def test_shift_letters_0():
    from noble_willow.core import shift_letters
    assert shift_letters('hello world') == 'czggj rjmgy'


def test_shift_letters_1():
    from noble_willow.core import shift_letters
    assert shift_letters('xyz-ABC') == 'stu-ABC'
