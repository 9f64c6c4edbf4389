"""Hidden tests (generated)."""


def test_dedupe_0():
    from brave_quartz.parse import dedupe
    assert dedupe([4, 4, 4, 4, 0, 0, 3, 5, 5, 3]) == [4, 0, 3, 5]


def test_dedupe_1():
    from brave_quartz.parse import dedupe
    assert dedupe(['m', 'i', 's', 's', 'i', 's', 's', 'i', 'p', 'p', 'i']) == ['m', 'i', 's', 'p']
