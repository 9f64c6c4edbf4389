"""Hidden tests (generated)."""


def test_initials_0():
    from misty_comet.text import initials
    assert initials('grace brewster hopper') == 'G.B.H.'


def test_initials_1():
    from misty_comet.text import initials
    assert initials('alan') == 'A.'


def test_seq_term_0():
    from misty_comet.text import seq_term
    assert seq_term(3) == 2


def test_seq_term_1():
    from misty_comet.text import seq_term
    assert seq_term(13) == 233
