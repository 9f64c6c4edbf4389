"""Hidden tests (generated)."""


def test_rle_encode_0():
    from tiny_canyon.numbers import rle_encode
    assert rle_encode('baaaaaaabb') == 'b1a7b2'


def test_rle_encode_1():
    from tiny_canyon.numbers import rle_encode
    assert rle_encode('') == ''


def test_initials_0():
    from tiny_canyon.numbers import initials
    assert initials('grace brewster hopper') == 'G.B.H.'


def test_initials_1():
    from tiny_canyon.numbers import initials
    assert initials('alan') == 'A.'
