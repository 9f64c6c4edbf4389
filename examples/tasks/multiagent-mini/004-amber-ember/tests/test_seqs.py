"""Hidden tests (generated)."""


def test_chunks_0():
    from amber_ember.seqs import chunks
    assert chunks([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_chunks_1():
    from amber_ember.seqs import chunks
    assert chunks([]) == []


def test_clamp_0():
    from amber_ember.seqs import clamp
    assert clamp(-18) == -13


def test_clamp_1():
    from amber_ember.seqs import clamp
    assert clamp(22) == 19


def test_clamp_2():
    from amber_ember.seqs import clamp
    assert clamp(3) == 3
