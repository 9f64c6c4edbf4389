"""Hidden tests (generated)."""


def test_initials_0():
    from tiny_quartz.parse import initials
    assert initials('grace brewster hopper') == 'G.B.H.'


def test_initials_1():
    from tiny_quartz.parse import initials
    assert initials('alan') == 'A.'


def test_slugify_0():
    from tiny_quartz.parse import slugify
    assert slugify('Hello, World!') == 'hello-world'


def test_slugify_1():
    from tiny_quartz.parse import slugify
    assert slugify('  Ultra--Long  Horizon 2026 ') == 'ultra-long-horizon-2026'
