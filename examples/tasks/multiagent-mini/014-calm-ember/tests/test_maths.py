"""Hidden tests (generated)."""


def test_chunks_0():
    from calm_ember.maths import chunks
    assert chunks([0, 1, 2, 3, 4]) == [[0, 1, 2, 3], [4]]


def test_chunks_1():
    from calm_ember.maths import chunks
    assert chunks([]) == []


def test_dedupe_0():
    from calm_ember.maths import dedupe
    assert dedupe([0, 0, 3, 4, 1, 1, 1, 1, 4, 1]) == [0, 3, 4, 1]


def test_dedupe_1():
    from calm_ember.maths import dedupe
    assert dedupe(['m', 'i', 's', 's', 'i', 's', 's', 'i', 'p', 'p', 'i']) == ['m', 'i', 's', 'p']
