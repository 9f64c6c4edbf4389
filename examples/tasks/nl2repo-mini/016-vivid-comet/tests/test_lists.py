"""Hidden tests (generated)."""


def test_seq_term_0():
    from vivid_comet.lists import seq_term
    assert seq_term(2) == 3


def test_seq_term_1():
    from vivid_comet.lists import seq_term
    assert seq_term(25) == 167761


def test_median_0():
    from vivid_comet.lists import median
    assert median([20, 2, 2, 17, 8]) == 8.0


def test_median_1():
    from vivid_comet.lists import median
    assert median([20, 20, 11, 5]) == 15.5
