"""Hidden tests (generated)."""


def test_flatten_0():
    from noble_heron.parse import flatten
    assert flatten([1, [2, [3, 4]], 5]) == [1, 2, 3, 4, 5]


def test_flatten_1():
    from noble_heron.parse import flatten
    assert flatten([[], ['a'], [['b']]]) == ['a', 'b']


def test_slugify_0():
    from noble_heron.parse import slugify
    assert slugify('Hello, World!') == 'hello-world'


def test_slugify_1():
    from noble_heron.parse import slugify
    assert slugify('  Ultra--Long  Horizon 2026 ') == 'ultra-long-horizon-2026'
