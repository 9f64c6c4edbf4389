"""Hidden tests (generated)."""


def test_dedupe_0():
    from vivid_harbor.lists import dedupe
    assert dedupe([0, 5, 0, 0, 1, 2, 2, 0, 3, 3]) == [0, 5, 1, 2, 3]


def test_dedupe_1():
    from vivid_harbor.lists import dedupe
    assert dedupe(['m', 'i', 's', 's', 'i', 's', 's', 'i', 'p', 'p', 'i']) == ['m', 'i', 's', 'p']
