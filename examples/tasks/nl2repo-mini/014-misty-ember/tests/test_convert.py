"""Hidden tests (generated)."""


def test_fizzbuzz_0():
    from misty_ember.convert import fizzbuzz
    assert fizzbuzz(9) == ['1', '2', '3', 'Ping', '5', 'Pong', '7', 'Ping', '9']


def test_fizzbuzz_1():
    from misty_ember.convert import fizzbuzz
    assert fizzbuzz(15) == ['1', '2', '3', 'Ping', '5', 'Pong', '7', 'Ping', '9', '10', '11', 'PingPong', '13', '14', '15']


def test_dedupe_0():
    from misty_ember.convert import dedupe
    assert dedupe([1, 0, 0, 2, 5, 1, 2, 5, 2, 5]) == [1, 0, 2, 5]


def test_dedupe_1():
    from misty_ember.convert import dedupe
    assert dedupe(['m', 'i', 's', 's', 'i', 's', 's', 'i', 'p', 'p', 'i']) == ['m', 'i', 's', 'p']
