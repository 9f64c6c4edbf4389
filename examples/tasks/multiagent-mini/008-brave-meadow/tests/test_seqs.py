"""Hidden tests (generated)."""


def test_count_vowels_0():
    from brave_meadow.seqs import count_vowels
    assert count_vowels('sky') == 0


def test_count_vowels_1():
    from brave_meadow.seqs import count_vowels
    assert count_vowels('Banana') == 3


def test_transpose_0():
    from brave_meadow.seqs import transpose
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_transpose_1():
    from brave_meadow.seqs import transpose
    assert transpose([[0]]) == [[0]]
