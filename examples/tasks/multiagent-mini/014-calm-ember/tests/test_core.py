"""Hidden tests (generated)."""


def test_word_counts_0():
    from calm_ember.core import word_counts
    assert word_counts('One one ONE two') == {'one': 3, 'two': 1}


def test_word_counts_1():
    from calm_ember.core import word_counts
    assert word_counts('to be or not to be') == {'to': 2, 'be': 2, 'or': 1, 'not': 1}


def test_rotate_0():
    from calm_ember.core import rotate
    assert rotate([0, 1, 2, 3, 4, 5]) == [2, 3, 4, 5, 0, 1]


def test_rotate_1():
    from calm_ember.core import rotate
    assert rotate(['a', 'b']) == ['a', 'b']
