"""Hidden tests (generated)."""


def test_initials_0():
    from vivid_ember.lists import initials
    assert initials('grace brewster hopper') == 'G.B.H.'


def test_initials_1():
    from vivid_ember.lists import initials
    assert initials('alan') == 'A.'


def test_rle_encode_0():
    from vivid_ember.lists import rle_encode
    assert rle_encode('abab') == 'a1b1a1b1'


def test_rle_encode_1():
    from vivid_ember.lists import rle_encode
    assert rle_encode('') == ''
