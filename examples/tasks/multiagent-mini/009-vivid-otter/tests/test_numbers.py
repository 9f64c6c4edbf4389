"""Hidden tests (generated)."""


def test_rle_encode_0():
    from vivid_otter.numbers import rle_encode
    assert rle_encode('aaabbaaaaaa') == 'a3b2a6'


def test_rle_encode_1():
    from vivid_otter.numbers import rle_encode
    assert rle_encode('') == ''


def test_count_vowels_0():
    from vivid_otter.numbers import count_vowels
    assert count_vowels('queue') == 4


def test_count_vowels_1():
    from vivid_otter.numbers import count_vowels
    assert count_vowels('sky') == 0
