"""Hidden tests (generated)."""


def test_add_47_0():
    from vivid_canyon.numbers import add_47
    assert add_47(-44) == 3


def test_add_47_1():
    from vivid_canyon.numbers import add_47
    assert add_47(783) == 830


def test_initials_0():
    from vivid_canyon.numbers import initials
    assert initials('grace brewster hopper') == 'G.B.H.'


def test_initials_1():
    from vivid_canyon.numbers import initials
    assert initials('alan') == 'A.'
