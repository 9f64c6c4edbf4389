"""Hidden tests (generated)."""


def test_shift_letters_0():
    from lunar_falcon.convert import shift_letters
    assert shift_letters('hello world') == 'vszzc kcfzr'


def test_shift_letters_1():
    from lunar_falcon.convert import shift_letters
    assert shift_letters('xyz-ABC') == 'lmn-ABC'


def test_clamp_0():
    from lunar_falcon.convert import clamp
    assert clamp(-16) == -11


def test_clamp_1():
    from lunar_falcon.convert import clamp
    assert clamp(31) == 28


def test_clamp_2():
    from lunar_falcon.convert import clamp
    assert clamp(8) == 8
