"""Hidden tests (generated)."""


def test_chunks_0():
    from tiny_canyon.parse import chunks
    assert chunks([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10]]


def test_chunks_1():
    from tiny_canyon.parse import chunks
    assert chunks([]) == []


def test_add_70_0():
    from tiny_canyon.parse import add_70
    assert add_70(-38) == 32


def test_add_70_1():
    from tiny_canyon.parse import add_70
    assert add_70(568) == 638
