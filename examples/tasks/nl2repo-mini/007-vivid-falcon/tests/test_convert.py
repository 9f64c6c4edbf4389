"""Hidden tests (generated)."""


def test_count_vowels_0():
    from vivid_falcon.convert import count_vowels
    assert count_vowels('queue') == 4


def test_count_vowels_1():
    from vivid_falcon.convert import count_vowels
    assert count_vowels('sky') == 0


def test_chunks_0():
    from vivid_falcon.convert import chunks
    assert chunks([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]


def test_chunks_1():
    from vivid_falcon.convert import chunks
    assert chunks([]) == []
