"""Hidden tests (generated)."""


def test_count_vowels_0():
    from misty_quartz.parse import count_vowels
    assert count_vowels('AEIOUxyz') == 5


def test_count_vowels_1():
    from misty_quartz.parse import count_vowels
    assert count_vowels('Programming') == 3


def test_flatten_0():
    from misty_quartz.parse import flatten
    assert flatten([1, [2, [3, 4]], 5]) == [1, 2, 3, 4, 5]


def test_flatten_1():
    from misty_quartz.parse import flatten
    assert flatten([[], ['a'], [['b']]]) == ['a', 'b']
