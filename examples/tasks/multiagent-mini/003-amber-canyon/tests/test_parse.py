"""Hidden tests (generated)."""


def test_add_84_0():
    from amber_canyon.parse import add_84
    assert add_84(-44) == 40


def test_add_84_1():
    from amber_canyon.parse import add_84
    assert add_84(249) == 333


def test_rotate_0():
    from amber_canyon.parse import rotate
    assert rotate([0, 1, 2, 3, 4, 5]) == [2, 3, 4, 5, 0, 1]


def test_rotate_1():
    from amber_canyon.parse import rotate
    assert rotate(['a', 'b']) == ['a', 'b']
