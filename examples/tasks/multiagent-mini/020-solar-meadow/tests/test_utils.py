"""Hidden tests (generated)."""


def test_dedupe_0():
    from solar_meadow.utils import dedupe
    assert dedupe([4, 2, 1, 3, 1, 1, 3, 1, 5, 1]) == [4, 2, 1, 3, 5]


def test_dedupe_1():
    from solar_meadow.utils import dedupe
    assert dedupe(['m', 'i', 's', 's', 'i', 's', 's', 'i', 'p', 'p', 'i']) == ['m', 'i', 's', 'p']


def test_initials_0():
    from solar_meadow.utils import initials
    assert initials('grace brewster hopper') == 'G.B.H.'


def test_initials_1():
    from solar_meadow.utils import initials
    assert initials('alan') == 'A.'
