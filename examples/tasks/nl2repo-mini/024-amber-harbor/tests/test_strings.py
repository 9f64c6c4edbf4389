"""Hidden tests (generated)."""


def test_clamp_0():
    from amber_harbor.strings import clamp
    assert clamp(-25) == -20


def test_clamp_1():
    from amber_harbor.strings import clamp
    assert clamp(21) == 18


def test_count_vowels_0():
    from amber_harbor.strings import count_vowels
    assert count_vowels('sky') == 0


def test_count_vowels_1():
    from amber_harbor.strings import count_vowels
    assert count_vowels('Banana') == 3
