"""Hidden tests (generated)."""


def test_to_roman_0():
    from misty_comet.core import to_roman
    assert to_roman(1) == 'I'


def test_to_roman_1():
    from misty_comet.core import to_roman
    assert to_roman(2058) == 'MMLVIII'


def test_count_vowels_0():
    from misty_comet.core import count_vowels
    assert count_vowels('rhythm') == 0


def test_count_vowels_1():
    from misty_comet.core import count_vowels
    assert count_vowels('Banana') == 3
