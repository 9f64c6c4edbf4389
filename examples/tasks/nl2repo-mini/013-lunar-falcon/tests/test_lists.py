"""Hidden tests (generated)."""


def test_initials_0():
    from lunar_falcon.lists import initials
    assert initials('grace brewster hopper') == 'G.B.H.'


def test_initials_1():
    from lunar_falcon.lists import initials
    assert initials('alan') == 'A.'
