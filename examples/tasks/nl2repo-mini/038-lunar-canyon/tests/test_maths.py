"""Hidden tests (generated)."""


def test_rle_encode_0():
    from lunar_canyon.maths import rle_encode
    assert rle_encode('bbbbbaa') == 'b5a2'


def test_rle_encode_1():
    from lunar_canyon.maths import rle_encode
    assert rle_encode('') == ''


def test_count_vowels_0():
    from lunar_canyon.maths import count_vowels
    assert count_vowels('rhythm') == 0


def test_count_vowels_1():
    from lunar_canyon.maths import count_vowels
    assert count_vowels('sky') == 0
