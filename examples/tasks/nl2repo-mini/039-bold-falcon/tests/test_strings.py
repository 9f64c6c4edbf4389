"""Hidden tests (generated)."""


def test_add_19_0():
    from bold_falcon.strings import add_19
    assert add_19(12) == 31


def test_add_19_1():
    from bold_falcon.strings import add_19
    assert add_19(627) == 646


def test_running_sum_0():
    from bold_falcon.strings import running_sum
    assert running_sum([5, -1, -2, 9, -9, 3]) == [5, 4, 2, 11, 2, 5]


def test_running_sum_1():
    from bold_falcon.strings import running_sum
    assert running_sum([]) == []
