"""Hidden tests (generated)."""


def test_chunks_0():
    from noble_willow.seqs import chunks
    assert chunks([0, 1, 2, 3, 4]) == [[0, 1], [2, 3], [4]]


def test_chunks_1():
    from noble_willow.seqs import chunks
    assert chunks([]) == []


def test_add_82_0():
    from noble_willow.seqs import add_82
    assert add_82(49) == 131


def test_add_82_1():
    from noble_willow.seqs import add_82
    assert add_82(659) == 741
