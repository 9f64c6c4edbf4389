"""Hidden tests (generated)."""


def test_dedupe_0():
    from swift_willow.lists import dedupe
    assert dedupe([5, 3, 3, 4, 4, 2, 0, 2, 4, 0]) == [5, 3, 4, 2, 0]


def test_dedupe_1():
    from swift_willow.lists import dedupe
    assert dedupe(['m', 'i', 's', 's', 'i', 's', 's', 'i', 'p', 'p', 'i']) == ['m', 'i', 's', 'p']


def test_word_counts_0():
    from swift_willow.lists import word_counts
    assert word_counts('a b a c b a') == {'a': 3, 'b': 2, 'c': 1}


def test_word_counts_1():
    from swift_willow.lists import word_counts
    assert word_counts('to be or not to be') == {'to': 2, 'be': 2, 'or': 1, 'not': 1}
