"""Hidden tests (generated)."""


def test_initials_0():
    from noble_quartz.seqs import initials
    assert initials('grace brewster hopper') == 'G.B.H.'


def test_initials_1():
    from noble_quartz.seqs import initials
    assert initials('alan') == 'A.'
