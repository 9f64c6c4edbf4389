"""Hidden tests (generated)."""


def test_initials_0():
    from vivid_falcon.strings import initials
    assert initials('grace brewster hopper') == 'G.B.H.'


def test_initials_1():
    from vivid_falcon.strings import initials
    assert initials('alan') == 'A.'


def test_rle_encode_0():
    from vivid_falcon.strings import rle_encode
    assert rle_encode('bbbbbbbbba') == 'b9a1'


def test_rle_encode_1():
    from vivid_falcon.strings import rle_encode
    assert rle_encode('') == ''
