"""Hidden tests (generated)."""


def test_chunks_0():
    from amber_heron.strings import chunks
    assert chunks([0, 1, 2, 3, 4]) == [[0, 1], [2, 3], [4]]


def test_chunks_1():
    from amber_heron.strings import chunks
    assert chunks([]) == []


def test_count_vowels_0():
    from amber_heron.strings import count_vowels
    assert count_vowels('queue') == 4


def test_count_vowels_1():
    from amber_heron.strings import count_vowels
    assert count_vowels('sky') == 0
