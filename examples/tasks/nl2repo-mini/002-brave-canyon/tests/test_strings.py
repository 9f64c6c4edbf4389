"""Hidden tests (generated)."""


def test_long_words_0():
    from brave_canyon.strings import long_words
    assert long_words('an agent trains on extremely long executions') == ['agent', 'trains', 'extremely', 'long', 'executions']


def test_long_words_1():
    from brave_canyon.strings import long_words
    assert long_words('tiny') == ['tiny']


def test_rle_encode_0():
    from brave_canyon.strings import rle_encode
    assert rle_encode('bbbbbbbbb') == 'b9'


def test_rle_encode_1():
    from brave_canyon.strings import rle_encode
    assert rle_encode('') == ''
