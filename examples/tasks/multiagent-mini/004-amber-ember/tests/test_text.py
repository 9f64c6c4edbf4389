"""Hidden tests (generated)."""


def test_seq_term_0():
    from amber_ember.text import seq_term
    assert seq_term(3) == 4


def test_seq_term_1():
    from amber_ember.text import seq_term
    assert seq_term(20) == 15127


def test_rle_encode_0():
    from amber_ember.text import rle_encode
    assert rle_encode('bbbbbbaaaaaa') == 'b6a6'


def test_rle_encode_1():
    from amber_ember.text import rle_encode
    assert rle_encode('') == ''
