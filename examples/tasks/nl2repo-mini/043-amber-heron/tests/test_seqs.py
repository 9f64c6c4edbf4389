"""Hidden tests (generated)."""


def test_running_sum_0():
    from amber_heron.seqs import running_sum
    assert running_sum([3, -6, -3, 6, -5, -6]) == [3, -3, -6, 0, -5, -11]


def test_running_sum_1():
    from amber_heron.seqs import running_sum
    assert running_sum([]) == []
