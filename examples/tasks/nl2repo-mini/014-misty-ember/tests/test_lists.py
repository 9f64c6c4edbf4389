"""Hidden tests (generated)."""


def test_count_vowels_0():
    from misty_ember.lists import count_vowels
    assert count_vowels('Banana') == 3


def test_count_vowels_1():
    from misty_ember.lists import count_vowels
    assert count_vowels('queue') == 4


def test_rotate_0():
    from misty_ember.lists import rotate
    assert rotate([0, 1, 2, 3, 4, 5]) == [1, 2, 3, 4, 5, 0]


def test_rotate_1():
    from misty_ember.lists import rotate
    assert rotate(['a', 'b']) == ['b', 'a']
