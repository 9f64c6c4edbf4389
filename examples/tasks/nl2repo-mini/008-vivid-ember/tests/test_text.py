"""Hidden tests (generated)."""


def test_flatten_0():
    from vivid_ember.text import flatten
    assert flatten([1, [2, [3, 4]], 5]) == [1, 2, 3, 4, 5]


def test_flatten_1():
    from vivid_ember.text import flatten
    assert flatten([[], ['a'], [['b']]]) == ['a', 'b']
