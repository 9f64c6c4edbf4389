"""Hidden tests (generated)."""


def test_long_words_0():
    from bold_ember.convert import long_words
    assert long_words('an agent trains on extremely long executions') == ['trains', 'extremely', 'executions']


def test_long_words_1():
    from bold_ember.convert import long_words
    assert long_words('tiny') == []


def test_slugify_0():
    from bold_ember.convert import slugify
    assert slugify('Hello, World!') == 'hello-world'


def test_slugify_1():
    from bold_ember.convert import slugify
    assert slugify('  Ultra--Long  Horizon 2026 ') == 'ultra-long-horizon-2026'
