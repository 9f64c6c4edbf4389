"""Hidden tests (generated)."""


def test_word_counts_0():
    from noble_maple.parse import word_counts
    assert word_counts('the cat and the hat') == {'the': 2, 'cat': 1, 'and': 1, 'hat': 1}


def test_word_counts_1():
    from noble_maple.parse import word_counts
    assert word_counts('to be or not to be') == {'to': 2, 'be': 2, 'or': 1, 'not': 1}


def test_flatten_0():
    from noble_maple.parse import flatten
    assert flatten([1, [2, [3, 4]], 5]) == [1, 2, 3, 4, 5]


def test_flatten_1():
    from noble_maple.parse import flatten
    assert flatten([[], ['a'], [['b']]]) == ['a', 'b']
