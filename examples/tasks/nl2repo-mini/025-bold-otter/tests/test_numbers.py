"""Hidden tests (generated)."""


def test_dedupe_0():
    from bold_otter.numbers import dedupe
    assert dedupe([4, 2, 1, 4, 0, 5, 1, 2, 4, 1]) == [4, 2, 1, 0, 5]


def test_dedupe_1():
    from bold_otter.numbers import dedupe
    assert dedupe(['m', 'i', 's', 's', 'i', 's', 's', 'i', 'p', 'p', 'i']) == ['m', 'i', 's', 'p']


def test_slugify_0():
    from bold_otter.numbers import slugify
    assert slugify('Hello, World!') == 'hello-world'


def test_slugify_1():
    from bold_otter.numbers import slugify
    assert slugify('  Ultra--Long  Horizon 2026 ') == 'ultra-long-horizon-2026'
