"""Hidden tests (generated)."""


def test_initials_0():
    from amber_harbor.convert import initials
    assert initials('grace brewster hopper') == 'G.B.H.'


def test_initials_1():
    from amber_harbor.convert import initials
    assert initials('alan') == 'A.'


def test_rle_encode_0():
    from amber_harbor.convert import rle_encode
    assert rle_encode('aabbbbbbbbaa') == 'a2b8a2'


def test_rle_encode_1():
    from amber_harbor.convert import rle_encode
    assert rle_encode('') == ''
