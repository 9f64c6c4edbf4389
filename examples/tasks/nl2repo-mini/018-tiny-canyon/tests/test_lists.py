"""Hidden tests (generated)."""


def test_slugify_0():
    from tiny_canyon.lists import slugify
    assert slugify('Hello, World!') == 'hello-world'


def test_slugify_1():
    from tiny_canyon.lists import slugify
    assert slugify('  Ultra--Long  Horizon 2026 ') == 'ultra-long-horizon-2026'
