"""Hidden tests (generated)."""


def test_add_45_0():
    from calm_otter.lists import add_45
    assert add_45(25) == 70


def test_add_45_1():
    from calm_otter.lists import add_45
    assert add_45(772) == 817


def test_running_sum_0():
    from calm_otter.lists import running_sum
    assert running_sum([-5, 2, -7, 2, 4, 6]) == [-5, -3, -10, -8, -4, 2]


def test_running_sum_1():
    from calm_otter.lists import running_sum
    assert running_sum([]) == []
