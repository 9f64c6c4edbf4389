"""Hidden tests (generated)."""


def test_chunks_0():
    from tiny_canyon.utils import chunks
    assert chunks([0, 1, 2, 3, 4]) == [[0, 1, 2], [3, 4]]


def test_chunks_1():
    from tiny_canyon.utils import chunks
    assert chunks([]) == []
