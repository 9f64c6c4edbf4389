"""Hidden tests (generated)."""


def test_slugify_0():
    from amber_quartz.strings import slugify
    assert slugify('Hello, World!') == 'hello-world'


def test_slugify_1():
    from amber_quartz.strings import slugify
    assert slugify('  Ultra--Long  Horizon 2026 ') == 'ultra-long-horizon-2026'


def test_rle_encode_0():
    from amber_quartz.strings import rle_encode
    assert rle_encode('bbbabbbb') == 'b3a1b4'


def test_rle_encode_1():
    from amber_quartz.strings import rle_encode
    assert rle_encode('') == ''
