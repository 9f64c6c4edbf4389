"""Hidden tests (generated)."""


def test_seq_term_0():
    from lunar_falcon.strings import seq_term
    assert seq_term(1) == 3


def test_seq_term_1():
    from lunar_falcon.strings import seq_term
    assert seq_term(21) == 39603


def test_shift_letters_0():
    from lunar_falcon.strings import shift_letters
    assert shift_letters('hello world') == 'ifmmp xpsme'


def test_shift_letters_1():
    from lunar_falcon.strings import shift_letters
    assert shift_letters('xyz-ABC') == 'yza-ABC'
