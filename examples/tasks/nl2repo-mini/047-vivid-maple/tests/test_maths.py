"""Hidden tests (generated)."""


def test_rotate_0():
    from vivid_maple.maths import rotate
    assert rotate([0, 1, 2, 3, 4, 5]) == [3, 4, 5, 0, 1, 2]


def test_rotate_1():
    from vivid_maple.maths import rotate
    assert rotate(['a', 'b']) == ['b', 'a']


def test_seq_term_0():
    from vivid_maple.maths import seq_term
    assert seq_term(2) == 4


def test_seq_term_1():
    from vivid_maple.maths import seq_term
    assert seq_term(19) == 15127
