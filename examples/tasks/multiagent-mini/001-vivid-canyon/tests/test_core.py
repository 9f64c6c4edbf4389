"""Hidden tests (generated)."""


def test_shift_letters_0():
    from vivid_canyon.core import shift_letters
    assert shift_letters('hello world') == 'vszzc kcfzr'


def test_shift_letters_1():
    from vivid_canyon.core import shift_letters
    assert shift_letters('xyz-ABC') == 'lmn-ABC'


def test_parse_pairs_0():
    from vivid_canyon.core import parse_pairs
    assert parse_pairs('x=1, y = two ,') == {'x': '1', 'y': 'two'}


def test_parse_pairs_1():
    from vivid_canyon.core import parse_pairs
    assert parse_pairs('k=v=w,,a=b') == {'k': 'v=w', 'a': 'b'}
