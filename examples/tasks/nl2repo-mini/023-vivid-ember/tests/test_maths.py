"""Hidden tests (generated)."""


def test_seq_term_0():
    from vivid_ember.maths import seq_term
    assert seq_term(1) == 1


def test_seq_term_1():
    from vivid_ember.maths import seq_term
    assert seq_term(25) == 75025


def test_slugify_0():
    from vivid_ember.maths import slugify
    assert slugify('Hello, World!') == 'hello-world'


def test_slugify_1():
    from vivid_ember.maths import slugify
    assert slugify('  Ultra--Long  Horizon 2026 ') == 'ultra-long-horizon-2026'
