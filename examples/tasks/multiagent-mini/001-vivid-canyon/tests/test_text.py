"""Hidden tests (generated)."""


def test_transpose_0():
    from vivid_canyon.text import transpose
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_transpose_1():
    from vivid_canyon.text import transpose
    assert transpose([[1]]) == [[1]]


def test_rle_encode_0():
    from vivid_canyon.text import rle_encode
    assert rle_encode('bbbbbbbbb') == 'b9'


def test_rle_encode_1():
    from vivid_canyon.text import rle_encode
    assert rle_encode('') == ''
