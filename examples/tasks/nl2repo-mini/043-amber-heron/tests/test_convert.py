"""Hidden tests (generated)."""


def test_flatten_0():
    from amber_heron.convert import flatten
    assert flatten([1, [2, [3, 4]], 5]) == [1, 2, 3, 4, 5]


def test_flatten_1():
    from amber_heron.convert import flatten
    assert flatten([[], ['a'], [['b']]]) == ['a', 'b']


def test_dedupe_0():
    from amber_heron.convert import dedupe
    assert dedupe([0, 3, 5, 2, 0, 0, 4, 3, 5, 1]) == [0, 3, 5, 2, 4, 1]


def test_dedupe_1():
    from amber_heron.convert import dedupe
    assert dedupe(['m', 'i', 's', 's', 'i', 's', 's', 'i', 'p', 'p', 'i']) == ['m', 'i', 's', 'p']
