"""Hidden tests (generated)."""


def test_dedupe_0():
    from quick_harbor.core import dedupe
    assert dedupe([1, 0, 5, 1, 5, 3, 0, 4, 2, 0]) == [1, 0, 5, 3, 4, 2]


def test_dedupe_1():
    from quick_harbor.core import dedupe
    assert dedupe(['m', 'i', 's', 's', 'i', 's', 's', 'i', 'p', 'p', 'i']) == ['m', 'i', 's', 'p']


def test_count_vowels_0():
    from quick_harbor.core import count_vowels
    assert count_vowels('AEIOUxyz') == 5


def test_count_vowels_1():
    from quick_harbor.core import count_vowels
    assert count_vowels('queue') == 4
