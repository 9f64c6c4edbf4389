"""Hidden tests (generated)."""


def test_slugify_0():
    from misty_ember.numbers import slugify
    assert slugify('Hello, World!') == 'hello-world'


def test_slugify_1():
    from misty_ember.numbers import slugify
    assert slugify('  Ultra--Long  Horizon 2026 ') == 'ultra-long-horizon-2026'


def test_transpose_0():
    from misty_ember.numbers import transpose
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_transpose_1():
    from misty_ember.numbers import transpose
    assert transpose([[3]]) == [[3]]
