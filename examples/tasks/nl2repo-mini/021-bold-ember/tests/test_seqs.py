"""Hidden tests (generated)."""


def test_transpose_0():
    from bold_ember.seqs import transpose
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_transpose_1():
    from bold_ember.seqs import transpose
    assert transpose([[7]]) == [[7]]


def test_word_counts_0():
    from bold_ember.seqs import word_counts
    assert word_counts('to be or not to be') == {'to': 2, 'be': 2, 'or': 1, 'not': 1}


def test_word_counts_1():
    from bold_ember.seqs import word_counts
    assert word_counts('the cat and the hat') == {'the': 2, 'cat': 1, 'and': 1, 'hat': 1}
