"""Hidden tests (generated)."""


def test_rle_encode_0():
    from noble_heron.core import rle_encode
    assert rle_encode('aaaaabbbbbb') == 'a5b6'


def test_rle_encode_1():
    from noble_heron.core import rle_encode
    assert rle_encode('') == ''
