"""Hidden tests (generated)."""


def test_shift_letters_0():
    from calm_willow.convert import shift_letters
    assert shift_letters('hello world') == 'axeeh phkew'


def test_shift_letters_1():
    from calm_willow.convert import shift_letters
    assert shift_letters('xyz-ABC') == 'qrs-ABC'


def test_slugify_0():
    from calm_willow.convert import slugify
    assert slugify('Hello, World!') == 'hello-world'


def test_slugify_1():
    from calm_willow.convert import slugify
    assert slugify('  Ultra--Long  Horizon 2026 ') == 'ultra-long-horizon-2026'
