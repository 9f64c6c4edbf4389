"""Hidden tests (generated)."""


def test_slugify_0():
    from brave_quartz.utils import slugify
    assert slugify('Hello, World!') == 'hello-world'


def test_slugify_1():
    from brave_quartz.utils import slugify
    assert slugify('  Ultra--Long  Horizon 2026 ') == 'ultra-long-horizon-2026'


def test_running_sum_0():
    from brave_quartz.utils import running_sum
    assert running_sum([4, 5, 4, 2, -2, 9]) == [4, 9, 13, 15, 13, 22]


def test_running_sum_1():
    from brave_quartz.utils import running_sum
    assert running_sum([]) == []
