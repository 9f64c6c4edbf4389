"""Hidden tests (generated)."""


def test_count_vowels_0():
    from calm_willow.parse import count_vowels
    assert count_vowels('sky') == 0


def test_count_vowels_1():
    from calm_willow.parse import count_vowels
    assert count_vowels('AEIOUxyz') == 5


def test_rle_encode_0():
    from calm_willow.parse import rle_encode
    assert rle_encode('abbbbaaaabbbb') == 'a1b4a4b4'


def test_rle_encode_1():
    from calm_willow.parse import rle_encode
    assert rle_encode('') == ''
