"""Hidden tests (generated)."""


def test_running_sum_0():
    from noble_willow.strings import running_sum
    assert running_sum([1, 5, -2, -9, 6, 9]) == [1, 6, 4, -5, 1, 10]


def test_running_sum_1():
    from noble_willow.strings import running_sum
    assert running_sum([]) == []


def test_slugify_0():
    from noble_willow.strings import slugify
    assert slugify('Hello, World!') == 'hello-world'


def test_slugify_1():
    from noble_willow.strings import slugify
    assert slugify('  Ultra--Long  Horizon 2026 ') == 'ultra-long-horizon-2026'
