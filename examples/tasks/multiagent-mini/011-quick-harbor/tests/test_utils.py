"""Hidden tests (generated)."""


def test_median_0():
    from quick_harbor.utils import median
    assert median([2, 5, 20, 18, 19]) == 18.0


def test_median_1():
    from quick_harbor.utils import median
    assert median([4, 10, 15, 0]) == 7.0


def test_fizzbuzz_0():
    from quick_harbor.utils import fizzbuzz
    assert fizzbuzz(8) == ['1', '2', '3', 'Ping', '5', 'Pong', '7', 'Ping']


def test_fizzbuzz_1():
    from quick_harbor.utils import fizzbuzz
    assert fizzbuzz(21) == ['1', '2', '3', 'Ping', '5', 'Pong', '7', 'Ping', '9', '10', '11', 'PingPong', '13', '14', '15', 'Ping', '17', 'Pong', '19', 'Ping', '21']
