"""Hidden tests (generated)."""


def test_to_bits_0():
    from brave_meadow.maths import to_bits
    assert to_bits(142) == '10001110'


def test_to_bits_1():
    from brave_meadow.maths import to_bits
    assert to_bits(0) == '00000000'


def test_slugify_0():
    from brave_meadow.maths import slugify
    assert slugify('Hello, World!') == 'hello-world'


def test_slugify_1():
    from brave_meadow.maths import slugify
    assert slugify('  Ultra--Long  Horizon 2026 ') == 'ultra-long-horizon-2026'
