"""Hidden tests (generated)."""


def test_slugify_0():
    from vivid_harbor.maths import slugify
    assert slugify('Hello, World!') == 'hello-world'


def test_slugify_1():
    from vivid_harbor.maths import slugify
    assert slugify('  Ultra--Long  Horizon 2026 ') == 'ultra-long-horizon-2026'


def test_running_sum_0():
    from vivid_harbor.maths import running_sum
    assert running_sum([0, -3, 4, 1, 8, -3]) == [0, -3, 1, 2, 10, 7]


def test_running_sum_1():
    from vivid_harbor.maths import running_sum
    assert running_sum([]) == []
