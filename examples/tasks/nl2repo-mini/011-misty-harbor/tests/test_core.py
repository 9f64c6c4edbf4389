"""Hidden tests (generated)."""


def test_dedupe_0():
    from misty_harbor.core import dedupe
    assert dedupe([3, 0, 1, 5, 4, 4, 3, 1, 2, 3]) == [3, 0, 1, 5, 4, 2]


def test_dedupe_1():
    from misty_harbor.core import dedupe
    assert dedupe(['m', 'i', 's', 's', 'i', 's', 's', 'i', 'p', 'p', 'i']) == ['m', 'i', 's', 'p']


def test_flatten_0():
    from misty_harbor.core import flatten
    assert flatten([1, [2, [3, 4]], 5]) == [1, 2, 3, 4, 5]


def test_flatten_1():
    from misty_harbor.core import flatten
    assert flatten([[], ['a'], [['b']]]) == ['a', 'b']
