"""Hidden tests (generated)."""


def test_initials_0():
    from quick_canyon.numbers import initials
    assert initials('grace brewster hopper') == 'G.B.H.'


def test_initials_1():
    from quick_canyon.numbers import initials
    assert initials('alan') == 'A.'


def test_running_sum_0():
    from quick_canyon.numbers import running_sum
    assert running_sum([1, -3, -7, 9, 0, 8]) == [1, -2, -9, 0, 0, 8]


def test_running_sum_1():
    from quick_canyon.numbers import running_sum
    assert running_sum([]) == []
