"""Hidden tests (generated)."""


def test_digit_sum_0():
    from vivid_harbor.convert import digit_sum
    assert digit_sum(93036) == 21


def test_digit_sum_1():
    from vivid_harbor.convert import digit_sum
    assert digit_sum(-67) == 13


def test_initials_0():
    from vivid_harbor.convert import initials
    assert initials('grace brewster hopper') == 'G.B.H.'


def test_initials_1():
    from vivid_harbor.convert import initials
    assert initials('alan') == 'A.'
