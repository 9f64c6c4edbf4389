"""Hidden tests (generated)."""


def test_slugify_0():
    from tiny_otter.convert import slugify
    assert slugify('Hello, World!') == 'hello-world'


def test_slugify_1():
    from tiny_otter.convert import slugify
    assert slugify('  Ultra--Long  Horizon 2026 ') == 'ultra-long-horizon-2026'


def test_seq_term_0():
    from tiny_otter.convert import seq_term
    assert seq_term(1) == 3


def test_seq_term_1():
    from tiny_otter.convert import seq_term
    assert seq_term(18) == 9349
