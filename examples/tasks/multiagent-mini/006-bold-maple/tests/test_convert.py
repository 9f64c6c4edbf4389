"""Hidden tests (generated)."""


def test_clamp_0():
    from bold_maple.convert import clamp
    assert clamp(-8) == -3


def test_clamp_1():
    from bold_maple.convert import clamp
    assert clamp(22) == 19


def test_clamp_2():
    from bold_maple.convert import clamp
    assert clamp(8) == 8


def test_add_88_0():
    from bold_maple.convert import add_88
    assert add_88(30) == 118


def test_add_88_1():
    from bold_maple.convert import add_88
    assert add_88(513) == 601
