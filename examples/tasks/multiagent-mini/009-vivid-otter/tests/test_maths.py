"""Hidden tests (generated)."""


def test_shift_letters_0():
    from vivid_otter.maths import shift_letters
    assert shift_letters('hello world') == 'yvccf nficu'


def test_shift_letters_1():
    from vivid_otter.maths import shift_letters
    assert shift_letters('xyz-ABC') == 'opq-ABC'


def test_initials_0():
    from vivid_otter.maths import initials
    assert initials('grace brewster hopper') == 'G.B.H.'


def test_initials_1():
    from vivid_otter.maths import initials
    assert initials('alan') == 'A.'
